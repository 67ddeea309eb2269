#!/usr/bin/env bash
# Session 37, call 5 (H100, little device time left): the whole gpu suite on main (3c06860: the
# expert workspace zeroed once at allocation, host code; a8d1533's device code; tests_main.txz).
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
s0=$SECONDS
timeout 280 tools/gpu/run-packed.sh .gpu-pack/tests_main.txz > "$R/r5_suite.txt" 2>&1
tail -32 "$R/r5_suite.txt"
[ -f "$R/failed.log" ] && tail -c 3000 "$R/failed.log"
echo "suite done at $((SECONDS - s0)) s"
