#!/usr/bin/env bash
# Session 37, call 5 (H100, little device time left): the engine-level gpu tests on main
# (3c06860: the expert workspace zeroed once at allocation, host code; a8d1533's device code;
# tests_main.txz): rollout, invariance, the transformers comparison and the kernels' tests.
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
s0=$SECONDS
timeout 120 tools/gpu/run-packed.sh .gpu-pack/tests_main.txz \
    --only "worker_(kernels|router|invariance|rollout)_gpu|worker_cuda_vs_transformers_gpu" > "$R/r5_suite.txt" 2>&1
tail -32 "$R/r5_suite.txt"
[ -f "$R/failed.log" ] && tail -c 3000 "$R/failed.log"
echo "suite done at $((SECONDS - s0)) s"
