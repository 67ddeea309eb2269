#!/usr/bin/env bash
# Session 30, call 1: the split decode attention with the q pair packed into one fragment
# (atc_block_p, tests_pk.txz) against main (tests_main.txz): the attention / invariance /
# transformers / rollout part of the gpu suite on the change, the attention kernels alone at
# decode shapes, then engine steps (b1 x 1k, b1 x 4k, b8 x 4k, b32 x 4k), old and new alternating.
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$R/r1_gpu.txt"
timeout 150 tools/gpu/run-packed.sh .gpu-pack/tests_pk.txz --only "worker_(kernels|invariance|cuda_vs_transformers|rollout)" > "$R/r1_suite.txt" 2>&1
tail -1 "$R/r1_suite.txt"
grep -E "FAIL" "$R/r1_suite.txt" | head
[ -f "$R/failed.log" ] && mv "$R/failed.log" "$R/r1_failed.log"
RW_PACK_DIR=/tmp/rw-old tools/gpu/run-packed.sh .gpu-pack/tests_main.txz --unpack-only > /dev/null 2>&1 || echo "unpack main failed"
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
for round in 1 2; do
    for v in old new; do
        b=/tmp/rw-packed/tools/bench/rw-bench
        [ $v = old ] && b=/tmp/rw-old/tools/bench/rw-bench
        echo "=== $v $round" >> "$R/r1_kernels.jsonl"
        timeout 60 "$b" $C kernels --kernel-attention d256x512,d32x8192,d8x8192,d8x4096,d1x8192,d1x4096,d1x1024 \
            --expert-tokens 1 --dense-tokens 1 --reps 20 2>> "$R/r1_kernels.err" | grep attention >> "$R/r1_kernels.jsonl"
    done
done
python3 - "$R/r1_kernels.jsonl" <<'PY'
import json, sys, collections
t = collections.defaultdict(lambda: collections.defaultdict(list))
v = None
for line in open(sys.argv[1]):
    if line.startswith("=== "):
        v = line.split()[1]
        continue
    try:
        j = json.loads(line)
    except ValueError:
        continue
    if j.get("median_s"):
        t[j["what"]][v].append(j["median_s"] * 1e6)
for w in t:
    print(w, " ".join("%s %s" % (k, "/".join("%.1f" % x for x in t[w][k])) for k in ("old", "new")))
PY
end=$((SECONDS + ${BENCH_S:-270}))
for round in 1 2 3; do
    for v in old new; do
        b=/tmp/rw-packed/tools/bench/rw-bench
        [ $v = old ] && b=/tmp/rw-old/tools/bench/rw-bench
        for bc in "1 1024 20" "1 4096 20" "8 4096 10" "32 4096 10"; do
            set -- $bc
            [ $SECONDS -ge $end ] && break 3
            echo "=== $v $round" >> "$R/r1_decode.jsonl"
            timeout 90 "$b" $C decode --batches $1 --ctxs $2 --steps $3 --gen 1,16,2 --gen-reps 1 \
                --no-quant >> "$R/r1_decode.jsonl" 2>> "$R/r1_decode.err"
        done
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
