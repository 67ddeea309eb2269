#!/usr/bin/env bash
# Session 28, call 2: G1L's decode points at 4k where the 64-token tile rule applies (batches 32,
# 64, 128), the tree before it (tests_s27a, /tmp/rw-old) against a3e9110 (tests_s27b,
# /tmp/rw-packed), alternating; the points that do not fit the GPU's memory fail and are skipped.
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
[ -x /tmp/rw-old/tools/bench/rw-bench ] ||
    RW_PACK_DIR=/tmp/rw-old tools/gpu/run-packed.sh .gpu-pack/tests_s27a.txz --unpack-only > /dev/null 2>&1
[ -x /tmp/rw-packed/tools/bench/rw-bench ] ||
    tools/gpu/run-packed.sh .gpu-pack/tests_s27b.txz --unpack-only > /dev/null 2>&1
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
end=$((SECONDS + ${BENCH_S:-480}))
for round in 1 2; do
    for v in old new; do
        b=/tmp/rw-packed/tools/bench/rw-bench
        [ $v = old ] && b=/tmp/rw-old/tools/bench/rw-bench
        for bt in 32 64 128; do
            [ $SECONDS -ge $end ] && break 3
            echo "=== $v $round $bt" >> "$R/${RUN17_TAG:-r17}_g1l.jsonl"
            timeout 90 "$b" $C decode --batches $bt --ctxs 4096 --steps 10 --gen 1,16,2 \
                --gen-reps 1 --no-quant >> "$R/${RUN17_TAG:-r17}_g1l.jsonl" 2>> "$R/${RUN17_TAG:-r17}_g1l.err"
        done
    done
done
python3 - "$R/${RUN17_TAG:-r17}_g1l.jsonl" <<'PY'
import json, sys
v = None
for line in open(sys.argv[1]):
    if line.startswith("=== "):
        v = line.split()[1:]
        continue
    try:
        o = json.loads(line)
    except ValueError:
        continue
    if o.get("what", "").startswith(("decode_bf16", "decode_forward")):
        print(" ".join(v), o["what"], o.get("batch"), o.get("ctx"),
              round(o.get("median_s", 0) * 1e3, 3), "ms", o.get("ratio"), o.get("target_id"))
PY
