#!/usr/bin/env bash
# Session 30, call 2: atc_block_pt (the packed q pair's scores, then P.V with the keys on the M
# side: the split form of <= 8 rows and the unsplit ring) in tests_pt.txz, against main
# (tests_main.txz) and the first packed form (tests_pk.txz, 2d91500): the attention part of the
# gpu suite on pt, the attention kernels alone (three variants alternating), then engine steps
# (b1 x 1k, b8 x 4k, b256 x 512, b32 x 4k), main and pt alternating.
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$R/r2_gpu.txt"
timeout 150 tools/gpu/run-packed.sh .gpu-pack/tests_pt.txz --only "worker_(kernels|invariance|cuda_vs_transformers|rollout)" > "$R/r2_suite.txt" 2>&1
tail -1 "$R/r2_suite.txt"
grep -E "FAIL" "$R/r2_suite.txt" | head
[ -f "$R/failed.log" ] && mv "$R/failed.log" "$R/r2_failed.log"
RW_PACK_DIR=/tmp/rw-old tools/gpu/run-packed.sh .gpu-pack/tests_main.txz --unpack-only > /dev/null 2>&1 || echo "unpack main failed"
RW_PACK_DIR=/tmp/rw-pk tools/gpu/run-packed.sh .gpu-pack/tests_pk.txz --unpack-only > /dev/null 2>&1 || echo "unpack pk failed"
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
bin() { case $1 in old) echo /tmp/rw-old/tools/bench/rw-bench ;; pk) echo /tmp/rw-pk/tools/bench/rw-bench ;; *) echo /tmp/rw-packed/tools/bench/rw-bench ;; esac; }
for round in 1 2; do
    for v in old pk pt; do
        echo "=== $v $round" >> "$R/r2_kernels.jsonl"
        timeout 60 "$(bin $v)" $C kernels --kernel-attention d256x512,d128x1024,d32x8192,d8x8192,d8x4096,d1x8192,d1x4096,d1x1024 \
            --expert-tokens 1 --dense-tokens 1 --reps 20 2>> "$R/r2_kernels.err" | grep attention_decode >> "$R/r2_kernels.jsonl"
    done
done
python3 - "$R/r2_kernels.jsonl" <<'PY'
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
    print(w, " ".join("%s %s" % (k, "/".join("%.1f" % x for x in t[w][k])) for k in ("old", "pk", "pt")))
PY
end=$((SECONDS + ${BENCH_S:-250}))
for round in 1 2 3; do
    for v in old pt; do
        for bc in "1 1024 20" "8 4096 10" "256 512 8" "32 4096 10"; do
            set -- $bc
            [ $SECONDS -ge $end ] && break 3
            echo "=== $v $round" >> "$R/r2_decode.jsonl"
            timeout 90 "$(bin $v)" $C decode --batches $1 --ctxs $2 --steps $3 --gen 1,16,2 --gen-reps 1 \
                --no-quant >> "$R/r2_decode.jsonl" 2>> "$R/r2_decode.err"
        done
    done
done
python3 - "$R/r2_decode.jsonl" <<'PY'
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
