#!/usr/bin/env bash
# Session 35, call 9: call 6's stamps (bstamps2) beside the same stamps with RoPE's early
# trigger (srearly: rw_pdl_begin_early in the RoPE kernel, the thirty-fourth session's
# ropeearly.patch). Call 6 put 1.6-2.4 us between RoPE's end and the attention's wait, its CTAs
# entering only after RoPE ended; the early trigger measured no step gain then. Whether it
# removes that gap, and what it moves instead. Archive: pack-variants bstamps2=bstamps2.patch
# srearly=bstamps2_rearly.patch.
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R" /tmp/rw-variants
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader > "$R/r9_gpu.txt"
tar xJf .gpu-pack/variants.txz -C /tmp/rw-variants
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
for v in bstamps2 srearly; do
timeout 120 /tmp/rw-variants/rw-$v $C decode --batches 1 --ctxs 1024 --steps 20 --gen 1,16,2 \
    --gen-reps 1 --no-quant --no-forward 2> /tmp/err.txt | grep -E '"what":"decode' | head -1 > "$R/r9_bench_$v.txt"
grep BDBG /tmp/err.txt > /tmp/r9_$v.txt
echo "== $v: $(grep -o '"ms_per_step":[0-9.]*' "$R/r9_bench_$v.txt")"
python3 - /tmp/r9_$v.txt <<'PY' | tee "$R/r9_summary_$v.txt"
import re, sys, collections, statistics
recs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    m = re.match(r"BDBG (\w+) cta (\d+) entry (\d+) wait (\d+) mid (\d+) end (\d+)", line)
    if m:
        recs[m.group(1)].append([int(v) for v in m.groups()[1:]])
L = []
for k, rows in recs.items(): # a launch: records whose wait returns within 3 us of the last
    rows.sort(key=lambda r: r[2])
    cur = []
    for r in rows + [None]:
        if cur and (r is None or r[2] - cur[-1][2] > 3000):
            e = [x[1] for x in cur]; w = [x[2] for x in cur]; x_ = [x[4] for x in cur]
            L.append(dict(k=k, n=len(cur), e0=min(e), w0=min(w), wm=statistics.median(w),
                          w1=max(w), x0=min(x_), xm=statistics.median(x_), x1=max(x_),
                          mid=cur[0][3]))
            cur = []
        if r is not None: cur.append(r)
L.sort(key=lambda d: d["w0"])
routers = [i for i, d in enumerate(L) if d["k"] == "router"]
print(f"{len(L)} launches; {len(routers)} router launches")
gaps = collections.defaultdict(list)
for i in range(1, len(L)):
    a, b = L[i - 1], L[i]
    if b["w0"] - a["x1"] < 50e3:
        gaps[(a["k"], b["k"])].append((b["w0"] - a["x1"]) / 1e3)
print("gap from a kernel's last CTA end to the next stamped kernel's first wait return, us (median, min, max, count):")
for (a, b), v in sorted(gaps.items()):
    print(f"  {a:6s} -> {b:6s} {statistics.median(v):6.2f} {min(v):6.2f} {max(v):6.2f} {len(v)}")
for ri in routers[-200:-197]:
    t0 = L[ri]["w0"]
    print(f"around a router launch: us from its wait's return (CTAs, first entry, wait "
          f"min/median/max, end min/median/max, gap = wait min - previous end max)")
    prev = None
    for d in L[max(0, ri - 9): ri + 3]:
        f = lambda v: f"{(v - t0) / 1e3:7.2f}"
        gap = f"{(d['w0'] - prev['x1']) / 1e3:6.2f}" if prev else "     -"
        print(f"  {d['k']:6s} {d['n']:4d}  entry {f(d['e0'])}  wait {f(d['w0'])} {f(d['wm'])} "
              f"{f(d['w1'])}  end {f(d['x0'])} {f(d['xm'])} {f(d['x1'])}  gap {gap}"
              + (f"  (logits {f(d['mid'])})" if d["k"] == "router" else ""))
        prev = d
ph = [d for d in L if d["k"] == "rphase"][-600:]
if ph:
    q = lambda v: f"{statistics.median(v) / 1e3:.2f}"
    print("router's routing CTA after its logits, us (medians of", len(ph), "launches): norm writes",
          q([d["w0"] - d["e0"] for d in ph]), " routing", q([d["mid"] - d["w0"] for d in ph]),
          " sort", q([d["x1"] - d["mid"] for d in ph]))
PY
done
