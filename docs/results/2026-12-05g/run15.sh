#!/usr/bin/env bash
# Session 27, call 2: the gpu suite on a3e9110 (tests_s27b: 8 < M <= 128 on the 64-token wgmma
# tiles), then the dense GEMMs of 033472e (tests_s27a, the rule before) and a3e9110 in
# alternating rounds, 20 repetitions a line, at 1-256 tokens.
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$R/r15_gpu.txt"
timeout 200 tools/gpu/run-packed.sh .gpu-pack/tests_s27b.txz > "$R/r15_suite.txt" 2>&1
tail -2 "$R/r15_suite.txt"
grep -E "FAIL|gemm_gpu" "$R/r15_suite.txt" | head
[ -f "$R/failed.log" ] && mv "$R/failed.log" "$R/r15_failed.log"
rm -f "$R/suite.txt"
RW_PACK_DIR=/tmp/rw-old tools/gpu/run-packed.sh .gpu-pack/tests_s27a.txz --unpack-only > /dev/null 2>&1
args=(--config "$(pwd)/tools/configs/qwen3-30b-a3b.json" kernels --kernel-attention d1x1024
      --expert-tokens 1 --dense-tokens 1,16,32,64,100,128,256 --reps 20)
end=$((SECONDS + ${BENCH_S:-100}))
for round in 1 2 3; do
    for v in old new; do
        [ $SECONDS -ge $end ] && break 2
        b=/tmp/rw-packed/tools/bench/rw-bench
        [ $v = old ] && b=/tmp/rw-old/tools/bench/rw-bench
        echo "=== $v $round" >> "$R/r15_dense.txt"
        timeout 40 "$b" "${args[@]}" 2>&1 | grep '"dense_' >> "$R/r15_dense.txt"
    done
done
python3 - "$R/r15_dense.txt" <<'PY'
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
    if "median_s" in j:
        t[j["what"]][v].append(j["median_s"] * 1e6)
        t[j["what"]]["cublaslt"].append(j.get("cublaslt_s", 0) * 1e6)
for w in sorted(t, key=lambda w: (w.split("_m")[0], int(w.split("_m")[1]))):
    print(w, " ".join("%s %s" % (k, "/".join("%.1f" % x for x in t[w][k])) for k in ("old", "new", "cublaslt")))
PY
