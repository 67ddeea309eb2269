#!/usr/bin/env bash
# Session 36, call 7 (H100): the stamps build (meson -Dstamps=true) of main a609796, whose expert
# passes stamp their first stage's arrival as the mid point, against the same build with
# b44d9fa's expert-pass change taken out (af_only.patch reversed): where a one-token w13 pass's
# first stage lands after its wait, before and after the weights went out one round trip after
# it. b1 x 1k, 20 steps each, twice in turns; tools/bench/stamps.py reads each run.
# Archive: stamps2.txz (rw-stamps-af, rw-stamps-base).
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R" /tmp/rw-st
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader > "$R/r7_gpu.txt"
tar xJf .gpu-pack/stamps2.txz -C /tmp/rw-st
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
for round in 1 2; do
    for v in base af; do
        timeout 60 /tmp/rw-st/rw-stamps-$v $C decode --batches 1 --ctxs 1024 --steps 20 --gen 1,16,2 \
            --gen-reps 1 --no-quant --no-forward > /tmp/r7_$v.jsonl 2> /tmp/r7_$v.txt
        grep '"decode_bf16"' /tmp/r7_$v.jsonl | sed "s/^/$v $round /" >> "$R/r7_bench.txt"
        { echo "=== $v round $round"; python3 tools/bench/stamps.py /tmp/r7_$v.txt --around route --pick 100; } >> "$R/r7_summary.txt"
    done
done
grep -E '^===|^  w13 |^  w2 |^  route ' "$R/r7_summary.txt"
python3 - "$R/r7_bench.txt" <<'PY'
import json, sys
for l in open(sys.argv[1]):
    v, r, j = l.split(" ", 2)
    o = json.loads(j)
    print(v, r, round(o["median_s"] * 1e3, 3), "ms", o["hbm_gbps"])
PY
