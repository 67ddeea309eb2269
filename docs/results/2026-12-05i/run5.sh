#!/usr/bin/env bash
# Session 30, call 5: a split CTA with one segment stages the whole segment at once
# (tests_wh.txz) against 2d91500 (tests_pk.txz): the suite's attention tests on wh, the decode
# attention kernels alone (two rounds), engine steps b1 x 1k and b1 x 2k alternating.
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$R/r5_gpu.txt"
timeout 100 tools/gpu/run-packed.sh .gpu-pack/tests_wh.txz --only "worker_(kernels|invariance|cuda_vs_transformers|rollout)" > "$R/r5_suite.txt" 2>&1
tail -1 "$R/r5_suite.txt"
grep -E "FAIL" "$R/r5_suite.txt" | head
RW_PACK_DIR=/tmp/rw-old tools/gpu/run-packed.sh .gpu-pack/tests_pk.txz --unpack-only > /dev/null 2>&1 || echo "unpack pk failed"
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
for round in 1 2; do
    for v in old new; do
        b=/tmp/rw-packed/tools/bench/rw-bench
        [ $v = old ] && b=/tmp/rw-old/tools/bench/rw-bench
        echo "=== $v $round" >> "$R/r5_kernels.jsonl"
        timeout 60 "$b" $C kernels --kernel-attention d1x512,d1x1024,d1x2048,d1x4096,d8x4096,d32x8192 \
            --expert-tokens 1 --dense-tokens 1 --reps 20 2>> "$R/r5_err.txt" | grep attention_decode >> "$R/r5_kernels.jsonl"
    done
done
python3 - "$R/r5_kernels.jsonl" <<'PY'
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
end=$((SECONDS + ${BENCH_S:-130}))
for round in 1 2 3; do
    for v in old new; do
        b=/tmp/rw-packed/tools/bench/rw-bench
        [ $v = old ] && b=/tmp/rw-old/tools/bench/rw-bench
        for bc in "1 1024 20" "1 2048 20"; do
            set -- $bc
            [ $SECONDS -ge $end ] && break 3
            echo "=== $v $round" >> "$R/r5_decode.jsonl"
            timeout 60 "$b" $C decode --batches $1 --ctxs $2 --steps $3 --gen 1,16,2 --gen-reps 1 \
                --no-quant >> "$R/r5_decode.jsonl" 2>> "$R/r5_err.txt"
        done
    done
done
python3 - "$R/r5_decode.jsonl" <<'PY'
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
    w = o.get("what", "")
    if (w == "decode_bf16" or o.get("target_id") == "G2/forward") and o.get("median_s"):
        print(" ".join(v), w, o.get("batch"), o.get("ctx"), round(o["median_s"] * 1e3, 3), "ms")
PY
