#!/usr/bin/env bash
# Session 29, call 1: the gpu suite on the q/k/v heads form (branch gemv-rope, tests_rope.txz),
# then G2 b1 x 1k and G1L b8 x 4k on main (tests_main.txz, e4e3868) and the branch, alternating,
# and the b1 step kernel table on the branch.
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$R/r1_gpu.txt"
timeout 200 tools/gpu/run-packed.sh .gpu-pack/tests_rope.txz > "$R/r1_suite.txt" 2>&1
tail -2 "$R/r1_suite.txt"
grep -E "FAIL" "$R/r1_suite.txt" | head
[ -f "$R/failed.log" ] && mv "$R/failed.log" "$R/r1_failed.log"
RW_PACK_DIR=/tmp/rw-old tools/gpu/run-packed.sh .gpu-pack/tests_main.txz --unpack-only > /dev/null 2>&1
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
end=$((SECONDS + ${BENCH_S:-200}))
for round in 1 2 3; do
    for v in old new; do
        [ $SECONDS -ge $end ] && break 2
        b=/tmp/rw-packed/tools/bench/rw-bench
        [ $v = old ] && b=/tmp/rw-old/tools/bench/rw-bench
        echo "=== $v $round" >> "$R/r1_decode.jsonl"
        timeout 60 "$b" $C decode --batches 1 --ctxs 1024 --steps 20 --gen 1,16,2 --gen-reps 1 \
            --no-quant >> "$R/r1_decode.jsonl" 2>> "$R/r1_decode.err"
        timeout 60 "$b" $C decode --batches 8 --ctxs 4096 --steps 10 --gen 1,16,2 --gen-reps 1 \
            --no-quant >> "$R/r1_decode.jsonl" 2>> "$R/r1_decode.err"
    done
done
python3 - "$R/r1_decode.jsonl" <<'PY'
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
    if o.get("what", "").startswith(("decode_bf16", "decode_forward")) and o.get("median_s"):
        print(" ".join(v), o["what"], o.get("batch"), o.get("ctx"),
              round(o["median_s"] * 1e3, 3), "ms", o.get("ratio"), o.get("target_id"))
PY
RW_BUILD_DIR=/tmp/rw-packed timeout 150 tools/gpu/kernel-times.sh 1 1024 > "$R/r1_ktimes_b1.txt" 2>&1
sed -n '/kernels, /,/^$/p' "$R/r1_ktimes_b1.txt" | head -20
rm -f "$R"/kernel_times_*.csv
