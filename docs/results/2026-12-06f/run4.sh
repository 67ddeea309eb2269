#!/usr/bin/env bash
# Session 38, call 4 (an H200, needs_h200: G1's b256 x 1k does not fit 80 GB): the target rows
# G1 / G2 / G3 on main (tests_main.txz's rw-bench, a8d1533's device code), run1.sh's first
# command alone (what device time was left).
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$R/r4_gpu.txt"
tools/gpu/run-packed.sh .gpu-pack/tests_main.txz --unpack-only > /dev/null 2>&1 || echo "unpack failed"
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
s0=$SECONDS
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
if [ "${mem:-0}" -ge 100000 ]; then
    timeout 200 /tmp/rw-packed/tools/bench/rw-bench $C decode --batches 1,256 --ctxs 1024 --steps 10 \
        --gen 1,16,2 --gen-reps 1 > "$R/r4_g123.jsonl" 2> /tmp/r4_g123.err
    grep -h '"decode_bf16\|"decode_mxfp8\|decode_forward' "$R"/r4_g123.jsonl | python3 -c "
import json,sys
for l in sys.stdin:
    o=json.loads(l)
    print(o['what'], o.get('batch'), o.get('ctx'), round(o.get('median_s',0)*1e3,3), 'ms', o.get('ratio'), o.get('hbm_gbps'), o.get('target_id'), o.get('met'))"
    tail -2 /tmp/r4_g123.err
fi
echo "all took $((SECONDS - s0)) s"
