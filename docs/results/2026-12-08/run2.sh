#!/usr/bin/env bash
# The follow-up to run1.sh on the same warm machine: the G1L sweep (batch 8-128 x 4k-8k, bf16)
# on an H200 (not measured on that card since the thirtieth session; b128 x 8k does not fit one),
# and with the argument `phase`, ../2026-12-07i/run3.sh (the per-phase table) first, where
# run1.sh had no time left for it.
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
s0=$SECONDS
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
[ "$1" = phase ] && bash docs/results/2026-12-07i/run3.sh
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
if [ "${mem:-0}" -ge 100000 ]; then
    mkdir -p /tmp/rw-g && tar xf .gpu-pack/variants.txz -C /tmp/rw-g
    left=$((570 - (SECONDS - s0)))
    timeout $left /tmp/rw-g/rw-main $C decode --batches 8,32,64 --ctxs 4096,8192 --steps 10 \
        --gen 1,16,2 --gen-reps 1 --no-quant > "$R/g1l.jsonl" 2> "$R/g1l.err"
    echo "G1L 8-64 exit $? at $((SECONDS - s0)) s"
    left=$((570 - (SECONDS - s0)))
    [ $left -ge 60 ] && timeout $left /tmp/rw-g/rw-main $C decode --batches 128 --ctxs 4096 \
        --steps 10 --gen 1,16,2 --gen-reps 1 --no-quant > "$R/g1l_128.jsonl" 2> "$R/g1l_128.err"
    echo "G1L 128 exit $? at $((SECONDS - s0)) s"
    cat "$R"/g1l*.jsonl | python3 -c '
import json, sys
for l in sys.stdin:
    j = json.loads(l)
    if j.get("what") in ("decode_bf16", "hbm_copy"):
        print(j["what"], j.get("batch"), j.get("ctx"), j.get("ms_per_step"), j.get("ratio"),
              j.get("achieved"))'
fi
echo "call took $((SECONDS - s0)) s"
