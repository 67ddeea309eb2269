#!/usr/bin/env bash
# Forty-ninth session, last call (main 02eab3c). s2 (s2.patch): the bf16 input-pair 128-token
# tiles on two stages of 48 KB without the group kept in flight, so that two CTAs share an SM
# and one's ramp and epilogue run under the other's MMAs (run8.sh's diagnostics in call 1: the
# w13 pass as fast without its copies as with them, so its loop, not its loads, holds it).
# The expert layer at 16,384 and 2048 tokens in turns (main, s2, ystage), s2's expert test,
# the 8 x 2k prefill as time allows.
# Archives: tools/gpu/pack-variants.sh BUILD main=- s2=s2.patch ystage=ystage.patch;
#   tests_s2.txz with s2.patch applied (tools/gpu/pack-tests.sh).
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
s0=$SECONDS
B=${RW_CALL_BUDGET:-200}
left() { echo $((B - (SECONDS - s0))); }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$R/z_gpu.txt"
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
RW_VARIANT_TIMEOUT=40 timeout 90 tools/gpu/run-variants.sh --rounds 2 main s2 ystage \
    -- $C kernels --kernel-attention p1x128 --expert-tokens 16384,2048 --dense-tokens 1 \
    > /dev/null 2>&1
mv "$R/variants.txt" "$R/z_kernels.txt"
python3 tools/bench/variant_lines.py "$R/z_kernels.txt" --what 'experts'
echo "kernels done at $((SECONDS - s0)) s"
l=$(left)
if [ $l -ge 50 ]; then
    timeout $((l - 3)) tools/gpu/run-packed.sh .gpu-pack/tests_s2.txz --only 'moe_experts' \
        > "$R/z_tests_s2.txt" 2>&1
    echo "s2 tests exit $? at $((SECONDS - s0)) s"; tail -n 3 "$R/z_tests_s2.txt"
    [ -f "$R/failed.log" ] && mv "$R/failed.log" "$R/z_failed_s2.log"
fi
l=$(left)
if [ $l -ge 45 ]; then
    RW_VARIANT_TIMEOUT=40 timeout $((l - 3)) tools/gpu/run-variants.sh --rounds 1 main s2 \
        -- $C prefill --prefill-reps 2 --no-quant > /dev/null 2>&1
    mv "$R/variants.txt" "$R/z_prefill.txt"
    python3 tools/bench/variant_lines.py "$R/z_prefill.txt" --what 'prefill'
fi
echo "call took $((SECONDS - s0)) s"
