#!/usr/bin/env bash
# Session 33, one call for what run1.sh and run2.sh would have done (device starts kept failing):
# the gpu suite on main (tests_main33.txz), then run2.sh's GEMV variants, then (H200, time left)
# b1 x 1k alone against b1 after b256 in one engine.
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader > "$R/r3_gpu.txt"
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
s0=$SECONDS
timeout 150 tools/gpu/run-packed.sh .gpu-pack/tests_main33.txz > "$R/r1_suite.txt" 2>&1
tail -1 "$R/r1_suite.txt"; grep -E "FAIL|TIMEOUT" "$R/r1_suite.txt" | head
[ -f "$R/failed.log" ] && tail -c 3000 "$R/failed.log"
echo "suite took $((SECONDS - s0)) s"
bash docs/results/2026-12-06a/run2.sh
if [ $((SECONDS - s0)) -lt 470 ]; then # bn32's gemm and invariance tests (tests_bn32.txz)
    RW_PACK_DIR=/tmp/rw-bn32 timeout 60 tools/gpu/run-packed.sh .gpu-pack/tests_bn32.txz \
        --only "worker_(gemm|invariance)_gpu" > "$R/r3_suite_bn32.txt" 2>&1
    tail -1 "$R/r3_suite_bn32.txt"; grep -E "FAIL" "$R/r3_suite_bn32.txt" | head
fi
if [ "$mem" -gt 100000 ] && [ $((SECONDS - s0)) -lt 440 ]; then
    B=/tmp/rw-packed/tools/bench/rw-bench
    C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
    for bs in 1 256,1; do
        echo "=== $bs" >> "$R/r1_diag.jsonl"
        nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader >> "$R/r1_diag.jsonl"
        timeout 90 $B $C decode --batches $bs --ctxs 1024 --steps 20 --gen 1,16,2 --gen-reps 1 \
            --no-quant --no-forward >> "$R/r1_diag.jsonl" 2>> "$R/r1_err.txt"
    done
    grep -h '"decode_bf16"' "$R/r1_diag.jsonl" | python3 -c "
import json, sys
for l in sys.stdin:
    o = json.loads(l); print(o['batch'], round(o['ctx_mean']), round(o['median_s'] * 1e3, 3), 'ms')"
fi
echo "run3 took $((SECONDS - s0)) s"
# the device tool returns at most 8 files: everything as one archive
(cd "$R" && tar czf /tmp/r3_all.tgz . && find . -type f -delete && mv /tmp/r3_all.tgz .)
