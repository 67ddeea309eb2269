#!/usr/bin/env bash
# Forty-fifth session, call 4: where the split decode kernel's last 11% of the copy rate goes at
# 32 x 8k. (1) The stamps build (-Dstamps=true, out/p/rw-bench-stamps): each CTA's entry, wait
# return and end, for the spread of the ends (a tail) against the launch. (2) In turns, 2 rounds:
# main; bs64 (the bench's KV blocks of 64 keys instead of 16: 16 KB contiguous a block and
# head instead of 4 KB, whether the chunk size costs DRAM efficiency); contig (each split CTA
# takes a contiguous run of segments instead of every nsplit-th: the same per-segment partials,
# so the same bits, other addresses in flight together).
# Archives: .gpu-pack/variants.txz (rw-main, rw-bs64, rw-contig); out/p/rw-bench-stamps.
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$R/gpu.txt"
s0=$SECONDS
B=${RW_CALL_BUDGET:-300}
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
timeout 60 out/p/rw-bench-stamps $C kernels --kernel-attention d32x8192 --expert-tokens 1 \
    --dense-tokens 1 --small-tokens 1 > "$R/stamps.jsonl" 2> "$R/stamps.err"
echo "stamps exit $?"
grep -c RW_STAMP "$R/stamps.err"
python3 tools/bench/stamps.py "$R/stamps.err" --around attn --before 1 --after 1 > "$R/stamps.txt" 2>&1
head -30 "$R/stamps.txt"
python3 - "$R/stamps.err" <<'PY' | tee "$R/stamps_ends.txt"
import sys, statistics
recs = []
for l in open(sys.argv[1]):
    p = l.split()
    if len(p) >= 12 and p[0] == "RW_STAMP" and p[1] == "attn":
        recs.append((int(p[7]), int(p[3]), int(p[11])))  # wait, cta, end
recs.sort()
# launches: records whose wait returns lie within 20 us of the launch's first
launches, cur = [], []
for r in recs:
    if cur and r[0] - cur[0][0] > 20000:
        launches.append(cur); cur = []
    cur.append(r)
if cur: launches.append(cur)
print(f"{len(launches)} attn launches, CTAs each: {sorted(set(len(x) for x in launches))}")
for L in launches[len(launches) // 2: len(launches) // 2 + 3]:
    w0 = min(r[0] for r in L)
    ends = sorted((r[2] - w0) / 1000 for r in L)
    waits = sorted((r[0] - w0) / 1000 for r in L)
    n = len(ends)
    q = lambda a, f: a[min(n - 1, int(f * n))]
    print(f"launch of {n}: wait max {waits[-1]:.1f} us; ends min {ends[0]:.1f} p10 {q(ends, .1):.1f} "
          f"p50 {q(ends, .5):.1f} p90 {q(ends, .9):.1f} max {ends[-1]:.1f} us")
PY
VT=$((B - (SECONDS - s0) - 10))
if [ $VT -ge 60 ]; then
    OUT=$R/v RW_VARIANT_TIMEOUT=45 timeout $VT tools/gpu/run-variants.sh --rounds 2 main bs64 contig -- \
        $C kernels --kernel-attention d32x8192,d8x8192,d1x1024 \
        --expert-tokens 1 --dense-tokens 1 --small-tokens 1
    python3 tools/bench/variant_lines.py "$R/v/variants.txt" --what "attention"
    mv "$R/v/variants.txt" "$R/variants.txt"; rm -rf "$R/v"
fi
echo "all took $((SECONDS - s0)) s"
