#!/usr/bin/env bash
# Prepared in session 26, not run: every dense GEMM tile (and, where K is split, the fold or the
# slices over CTAs) forced in turn on q/k/v, o_proj and the lm_head at 16-256 tokens, with the
# tree's own choice first: the data for a tile rule from measurements rather than estimates.
# o_proj at 64 tokens takes 32 us against cuBLASLt's 14 (r9, H100); the twelfth session's
# slices over CTAs at 8 < M <= 64 lost, but on the mma.sync tiles of then. variants_sweep.txz:
# tilesweep.patch (RW_GEMM_TILE="BN,TN,FOLD" read by rw_k_gemm; the split workspace for 256
# rows). About 31 rw-bench runs of 4-6 s.
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
d=/tmp/rw-sweep
rm -rf "$d" && mkdir -p "$d" && tar xf .gpu-pack/variants_sweep.txz -C "$d"
B="$d/rw-sweep"
args=(--config "$(pwd)/tools/configs/qwen3-30b-a3b.json" kernels --kernel-attention d1x1024
      --expert-tokens 1 --dense-tokens 16,32,64,128,256)
run() { # $1: label, then the environment
    local l=$1
    shift
    echo "=== $l" >> "$R/r13_sweep.txt"
    env "$@" timeout 40 "$B" "${args[@]}" 2>&1 | grep '"dense_' >> "$R/r13_sweep.txt"
}
run rule
for t in 128,128 128,64 64,64 128,32 64,32 128,16 32,32 64,16 128,8 32,16 64,8 16,16 32,8 16,8 128,96; do
    for f in 1 0; do
        run "$t,$f" RW_GEMM_TILE="$t,$f"
    done
done
python3 - "$R/r13_sweep.txt" <<'PY'
import json, sys, collections
best = collections.defaultdict(list)
label = None
for line in open(sys.argv[1]):
    if line.startswith("=== "):
        label = line[4:].strip()
        continue
    try:
        j = json.loads(line)
    except ValueError:
        continue
    if "median_s" not in j:
        continue
    best[j["what"]].append((j["median_s"] * 1e6, label, j.get("cublaslt_s", 0) * 1e6))
for what in sorted(best):
    rows = sorted(best[what])
    rule = [r for r in rows if r[1] == "rule"]
    print(what, "rule %.1f" % rule[0][0] if rule else "", "cublaslt %.1f" % rows[0][2],
          " ".join("%s:%.1f" % (l, t) for t, l, _ in rows[:4]))
PY
