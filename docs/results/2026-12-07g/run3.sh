#!/usr/bin/env bash
# Forty-eighth session: the w13 pass's waits. After 2897316 its top stall is still the wait on
# each stage's weight copy (the tensor copy's barrier), at a 57% L2 hit rate: the copies run two
# blocks ahead (4 stages of 48 KB fill shared memory) and the weights come from DRAM.
#   ch    passes of 16,384 tokens (run2: ch16k) with the test's second pass following the define
#   pfNc  ch + each weight block asked of L2 (cp.async.bulk.prefetch.tensor) N blocks before its
#         copy is issued (N = 2, 4, 8), on the tensor-copy tiles (bf16, 128 tokens)
# Same bits. Experts at 16,384 / 4096 / 2048 tokens in turns, the 8 x 2k prefill, ch's and pf4c's
# GPU tests.
# Archives: tools/gpu/pack-variants.sh BUILD main=- ch=ch.patch pf2c=pf2c.patch pf4c=pf4c.patch
#   pf8c=pf8c.patch; tests_ch.txz and tests_pf4c.txz with pack-tests.sh on ch / pf4c applied.
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$R/c_gpu.txt"
s0=$SECONDS
B=${RW_CALL_BUDGET:-400}
left() { echo $((B - (SECONDS - s0))); }
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
RW_VARIANT_TIMEOUT=60 timeout 220 tools/gpu/run-variants.sh --rounds 2 main ch pf2c pf4c pf8c \
    -- $C kernels --kernel-attention p1x128 --expert-tokens 16384,4096,2048 --dense-tokens 1 \
    > /dev/null 2>&1
mv "$R/variants.txt" "$R/c_kernels.txt"
python3 tools/bench/variant_lines.py "$R/c_kernels.txt" --what 'experts_t'
echo "kernels at $((SECONDS - s0)) s"
if [ "$(left)" -ge 60 ]; then
    RW_VARIANT_TIMEOUT=40 timeout 150 tools/gpu/run-variants.sh --rounds 1 main ch pf2c pf4c pf8c \
        -- $C prefill --prefill-reps 2 --no-quant > /dev/null 2>&1
    mv "$R/variants.txt" "$R/c_prefill.txt"
    python3 tools/bench/variant_lines.py "$R/c_prefill.txt" --what 'prefill'
    echo "prefill at $((SECONDS - s0)) s"
fi
for t in pf4c ch; do
    [ "$(left)" -ge 50 ] || break
    timeout $(($(left) - 5)) tools/gpu/run-packed.sh .gpu-pack/tests_$t.txz \
        --only 'moe|invariance|kernels_gpu|transformers' > "$R/c_tests_$t.txt" 2>&1
    echo "tests $t exit $? at $((SECONDS - s0)) s"; tail -n 10 "$R/c_tests_$t.txt"
    [ -f "$R/failed.log" ] && mv "$R/failed.log" "$R/c_failed_$t.log" && tail -n 30 "$R/c_failed_$t.log"
    rm -f "$R/suite.txt"
done
echo "all took $((SECONDS - s0)) s"
