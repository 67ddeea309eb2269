#!/usr/bin/env bash
# The fifty-first session's short call (the pool had refused seven starts; ~380 s of device time
# left for a call): ../2026-12-07i/run2.sh and the attention step of ../2026-12-07i/run1.sh cut to
# what decides whether f16att lands. First f16att's GPU tests (attention against its reference in
# every tiling and split, the KV write, batch invariance, F2 on both fixtures and precisions),
# then the attention kernels of main, q1 and f16att (prefill 8 x 2k and 1 x 8k, decode 256 x 1k;
# two rounds in turns), then decode b1 and b256 for main and f16att (one round). Archives:
# .gpu-pack/variants_att.txz and tests_all.txz (../2026-12-07i/README.md).
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
s0=$SECONDS
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$R/gpu.txt"
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
timeout 170 tools/gpu/run-packed.sh .gpu-pack/tests_all.txz --variant f16att \
    --only 'attention_gpu|kernels_gpu|transformers.*_gpu|invariance' > "$R/tests.txt" 2>&1
echo "tests exit $? at $((SECONDS - s0)) s"; tail -n 14 "$R/tests.txt"
[ -f "$R/failed.log" ] && mv "$R/failed.log" "$R/tests_failed.log"
rm -f "$R/suite.txt"
RW_VARIANT_TIMEOUT=40 timeout 100 tools/gpu/run-variants.sh --archive .gpu-pack/variants_att.txz \
    --rounds 2 main q1 f16att -- $C kernels --kernel-attention p8x2048,p1x8192,d256x1024 \
    --expert-tokens 1 --dense-tokens 1 > /dev/null 2>&1
mv "$R/variants.txt" "$R/attention.txt"
python3 tools/bench/variant_lines.py "$R/attention.txt" --what 'attention'
echo "attention done at $((SECONDS - s0)) s"
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
ctx=512; [ "${mem:-0}" -ge 100000 ] && ctx=1024
RW_VARIANT_TIMEOUT=50 timeout 110 tools/gpu/run-variants.sh --archive .gpu-pack/variants_att.txz \
    --rounds 1 main f16att -- $C decode --batches 1,256 --ctxs $ctx --steps 10 --gen 1,16,2 \
    --gen-reps 1 --no-quant > /dev/null 2>&1
mv "$R/variants.txt" "$R/decode.txt"
python3 tools/bench/variant_lines.py "$R/decode.txt" --what 'decode'
echo "call took $((SECONDS - s0)) s"
