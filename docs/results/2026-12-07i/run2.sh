#!/usr/bin/env bash
# Prepared in the fiftieth session, not run: the attention on fp16 operands (f16att.patch; the
# standard mode's KV cache fp16, q' one fp16, the softmax weights fp16, fp16 MMAs; the
# high-precision mode's bf16 pairs unchanged). First its GPU tests: the attention kernels against
# the reference that rounds q' as they do (test_attention_gpu, RW_TOL_ATTN_P16), the KV write
# (test_kernels_gpu, RW_TOL_ROPE_F16), batch invariance, and F2 against transformers on both
# fixtures and both precisions. worker_cuda_vs_transformers_hd128_gpu is marked should_fail
# (the bf16 cache flipped one router near-tie there): if the fp16 cache does not, meson reports
# an unexpected pass, which is the result to look for, not a fault. Then the engine: the 8 x 2k
# prefill (G4) and decode at b1 and b256 (G1 / G2 shapes; x 512 on an H100, x 1024 on an H200)
# for main and f16att in turns. Any card; about 5 minutes.
# Archives: tests_f16att.txz (tools/gpu/pack-tests.sh with f16att.patch applied) and
# variants_att.txz (run1.sh's head).
source .deps/env.sh
# a variant's tests: its own archive, or its part of tests_all.txz (tools/gpu/merge-packs.sh)
tests_of() { if [ -f .gpu-pack/tests_$1.txz ]; then echo .gpu-pack/tests_$1.txz; else echo ".gpu-pack/tests_all.txz --variant $1"; fi; }
R=${OUT:-out}
mkdir -p "$R"
s0=$SECONDS
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$R/b_gpu.txt"
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
timeout 200 tools/gpu/run-packed.sh $(tests_of f16att) \
    --only 'attention_gpu|kernels_gpu|transformers.*_gpu|invariance' > "$R/b_tests.txt" 2>&1
echo "tests exit $? at $((SECONDS - s0)) s"; tail -n 12 "$R/b_tests.txt"
[ -f "$R/failed.log" ] && mv "$R/failed.log" "$R/b_failed.log"
rm -f "$R/suite.txt"
RW_VARIANT_TIMEOUT=60 timeout 150 tools/gpu/run-variants.sh --archive .gpu-pack/variants_att.txz \
    --rounds 1 main f16att -- $C prefill --prefill-reps 2 --no-quant > /dev/null 2>&1
mv "$R/variants.txt" "$R/b_prefill.txt"
python3 tools/bench/variant_lines.py "$R/b_prefill.txt" --what 'prefill'
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
ctx=512; [ "${mem:-0}" -ge 100000 ] && ctx=1024
RW_VARIANT_TIMEOUT=80 timeout 200 tools/gpu/run-variants.sh --archive .gpu-pack/variants_att.txz \
    --rounds 2 main f16att -- $C decode --batches 1,256 --ctxs $ctx --steps 10 --gen 1,16,2 \
    --gen-reps 1 --no-quant \
    > /dev/null 2>&1
mv "$R/variants.txt" "$R/b_decode.txt"
python3 tools/bench/variant_lines.py "$R/b_decode.txt" --what 'decode'
echo "call took $((SECONDS - s0)) s"
