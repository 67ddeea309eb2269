#!/usr/bin/env bash
# Forty-fifth session, call 5: the balanced key split (the split decode CTAs share out the
# launch's (tile, kv head, segment) items in even ranges, a whole number of CTAs an SM: bal;
# flat: the same sharing over the old CTA count, RW_ATTN_BAL=0) against main. First the GPU
# tests it touches (bal's build), then the attention kernels in turns, 2 rounds, then the whole
# GPU suite if time is left.
# Archives: .gpu-pack/tests_bal.txz; .gpu-pack/variants.txz (rw-main, rw-bal, rw-flat).
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$R/gpu.txt"
s0=$SECONDS
B=${RW_CALL_BUDGET:-360}
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
timeout 80 tools/gpu/run-packed.sh .gpu-pack/tests_bal.txz \
    --only "worker_attention_gpu|worker_invariance_gpu|worker_invariance_high_gpu|worker_kernels_gpu|worker_cuda_vs_transformers_gpu" \
    > "$R/tests.txt" 2>&1
rc=$?
echo "tests exit $rc"; tail -7 "$R/tests.txt"
[ -f "$R/failed.log" ] && { tail -c 3000 "$R/failed.log"; echo "tests failed"; }
VT=$((B - (SECONDS - s0) - 100))
if [ $VT -ge 60 ]; then
    OUT=$R/v RW_VARIANT_TIMEOUT=45 timeout $VT tools/gpu/run-variants.sh --rounds 2 main bal flat -- \
        $C kernels --kernel-attention d32x8192,d8x8192,d32x4096,d16x4096,d8x4096,d1x4096,d1x1024 \
        --expert-tokens 1 --dense-tokens 1 --small-tokens 1
    python3 tools/bench/variant_lines.py "$R/v/variants.txt" --what "attention"
    mv "$R/v/variants.txt" "$R/variants.txt"; rm -rf "$R/v"
fi
left=$((B - (SECONDS - s0)))
if [ $rc -eq 0 ] && [ $left -ge 95 ]; then
    timeout $((left - 5)) tools/gpu/run-packed.sh .gpu-pack/tests_bal.txz > "$R/suite.txt" 2>&1
    echo "suite exit $?"; tail -2 "$R/suite.txt"
fi
echo "all took $((SECONDS - s0)) s"
