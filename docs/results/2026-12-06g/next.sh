#!/usr/bin/env bash
# For the next call (not run this session): the two-warpgroup mxfp8 tiles on per-stage full /
# empty barriers (decouple.patch, branch mx-decouple; builds, 71-77 registers, no spills) against
# main. Prepare on the CPU machine, from main with decouple.patch applying cleanly:
#   tools/gpu/pack-variants.sh BUILD main=- dec=$(pwd)/docs/results/2026-12-06g/decouple.patch
#   git apply docs/results/2026-12-06g/decouple.patch && touch moe/*.cu && ninja -C BUILD &&
#     tools/gpu/pack-tests.sh BUILD .gpu-pack/tests_dec.txz; git apply -R docs/results/2026-12-06g/decouple.patch
# Then on the GPU machine (carry .deps and .gpu-pack): the expert, invariance and CUDA-vs-CPU
# tests on the changed tree first (its barriers are new: a hang or a wrong byte stops here),
# then mxfp8-last-8 at b256 x 1k and bf16 beside it in turns (x 512 on an H100, where bf16 x 1k
# does not fit; the target command with b1 on an H200).
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
