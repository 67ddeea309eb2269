#!/usr/bin/env bash
# Forty-fourth session, call 10 (the device time left): the fused combine + norm dropping the
# expert rows it read from L2 (RW_MOE_Y_DROP in worker/cuda_forward.c, 1 in `yd`), against main
# (both at 904307e otherwise). First the GPU tests it touches (the build with the knob on),
# then bf16 b256 x 512 decode steps in turns.
# Archives: .gpu-pack/tests_yd.txz, .gpu-pack/variants.txz (rw-main, rw-yd).
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$R/e_gpu.txt"
s0=$SECONDS
B=${RW_CALL_BUDGET:-200}
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
timeout 70 tools/gpu/run-packed.sh .gpu-pack/tests_yd.txz \
    --only "worker_kernels_gpu|worker_invariance_gpu|worker_cuda_vs_transformers_gpu|moe_experts_gpu" \
    > "$R/e_tests.txt" 2>&1
echo "tests exit $?"; tail -6 "$R/e_tests.txt"
[ -f "$R/failed.log" ] && { tail -c 3000 "$R/failed.log"; echo "tests failed"; }
VT=$((B - (SECONDS - s0) - 10))
if [ $VT -ge 60 ]; then
    OUT=$R/v RW_VARIANT_TIMEOUT=70 timeout $VT tools/gpu/run-variants.sh --rounds 2 main yd -- $C \
        decode --batches 256 --ctxs 512 --steps 10 --gen 1,16,2 --gen-reps 1 --no-quant --no-forward
    python3 tools/bench/variant_lines.py "$R/v/variants.txt" --what "decode"
    mv "$R/v/variants.txt" "$R/e_variants.txt"; rm -rf "$R/v"
fi
echo "all took $((SECONDS - s0)) s"
