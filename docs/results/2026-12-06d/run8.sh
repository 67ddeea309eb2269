#!/usr/bin/env bash
# Session 36, call 8 (an H200; run4.sh cut to what the device time left holds): the target
# command of G1 / G2 / G3 on main (tests_main.txz: the code of b44d9fa).
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader > "$R/r8_gpu.txt"
tools/gpu/run-packed.sh .gpu-pack/tests_main.txz --unpack-only > /dev/null 2>&1 || echo "unpack failed"
B=/tmp/rw-packed/tools/bench/rw-bench
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
[ "${mem:-0}" -ge 100000 ] || { echo "not an H200: $mem MiB"; exit 1; }
timeout 200 "$B" $C decode --batches 1,256 --ctxs 1024 --steps 10 --gen 1,16,2 --gen-reps 1 \
    > "$R/r8_g123.jsonl" 2> "$R/r8_g123.err"
grep -h '"decode_bf16\|"decode_mxfp8\|decode_forward' "$R"/r8_g123.jsonl | python3 -c "
import json,sys
for l in sys.stdin:
    o=json.loads(l)
    print(o['what'], o.get('batch'), o.get('ctx'), round(o.get('median_s',0)*1e3,3), 'ms', o.get('ratio'), o.get('hbm_gbps'), o.get('target_id'), o.get('met'))"
