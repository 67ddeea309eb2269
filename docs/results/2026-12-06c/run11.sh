#!/usr/bin/env bash
# Session 35, call 11: the whole gpu suite on main after the GEMV's push-form slice sum landed
# (tests_main35.txz, packed from the final tree). One GPU: the TP2 and NCCL tests skip.
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader > "$R/r11_gpu.txt"
timeout 500 tools/gpu/run-packed.sh .gpu-pack/tests_main35.txz > "$R/r11_suite.txt" 2>&1
tail -6 "$R/r11_suite.txt"; grep -E "FAIL|TIMEOUT" "$R/r11_suite.txt" | head
[ -f "$R/failed.log" ] && tail -c 3000 "$R/failed.log"
