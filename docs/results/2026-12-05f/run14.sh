#!/usr/bin/env bash
# Session 27, call 1: the tile sweep prepared in session 26 (run13.sh), then the gpu suite on
# 033472e (tests_s27a: the landed dense tiles and sampler with two behaviour-neutral mends).
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$R/r14_gpu.txt"
timeout 280 bash .gpu-pack/run13.sh > "$R/r14_sweep_summary.txt" 2>&1
cat "$R/r14_sweep_summary.txt"
source .deps/env.sh
timeout 240 tools/gpu/run-packed.sh .gpu-pack/tests_s27a.txz > "$R/r14_suite.txt" 2>&1
tail -3 "$R/r14_suite.txt"
grep -E "FAIL" "$R/r14_suite.txt" | head
[ -f "$R/failed.log" ] && mv "$R/failed.log" "$R/r14_failed.log"
rm -f "$R/suite.txt"
