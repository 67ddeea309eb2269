#!/usr/bin/env bash
# The fortieth session's first call: docs/results/2026-12-06g/next.sh as prepared (decouple.patch
# tests on the GPU, then main vs dec in turns). Archives in .gpu-pack built from main c3888d0.
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$R/n_gpu.txt"
s0=$SECONDS
timeout 150 tools/gpu/run-packed.sh .gpu-pack/tests_dec.txz \
    --only "moe_experts_gpu|worker_invariance_gpu|worker_cuda_vs_transformers_gpu" > "$R/n_tests_dec.txt" 2>&1
tail -5 "$R/n_tests_dec.txt"; grep -h "quantized weights" /tmp/rw-packed/logs/*.log 2>/dev/null | sort -u
[ -f "$R/failed.log" ] && { tail -c 3000 "$R/failed.log"; echo "tests failed: no timing"; exit 1; }
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
if [ "${mem:-0}" -ge 100000 ]; then P="--batches 1,256 --ctxs 1024"; else P="--batches 256 --ctxs 512"; fi
OUT=$R/v RW_VARIANT_TIMEOUT=90 timeout 360 tools/gpu/run-variants.sh --rounds 3 main dec -- $C \
    decode $P --steps 10 --gen 1,16,2 --gen-reps 1 --no-forward
python3 tools/bench/variant_lines.py "$R/v/variants.txt" --what "decode_bf16|decode_mxfp8"
mv "$R/v/variants.txt" "$R/n_variants.txt"; rm -rf "$R/v"
echo "all took $((SECONDS - s0)) s"
