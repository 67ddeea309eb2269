#!/usr/bin/env bash
# Session 35, call 6: call 5's stamps (run5.sh) with every kernel of a one-token layer stamped:
# bstamps2.patch adds the RoPE + KV write kernel, the split attention and its combine, the
# expert combine + norm, and the router's phases after its logits (rphase: the norm's writes,
# the routing, the sort). Archive: pack-variants bstamps2=bstamps2.patch.
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R" /tmp/rw-variants
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader > "$R/r6_gpu.txt"
tar xJf .gpu-pack/variants.txz -C /tmp/rw-variants
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
timeout 120 /tmp/rw-variants/rw-bstamps2 $C decode --batches 1 --ctxs 1024 --steps 20 --gen 1,16,2 \
    --gen-reps 1 --no-quant --no-forward 2> "$R/err.txt" | grep -v BDBG > "$R/r6_bench.txt"
grep BDBG "$R/err.txt" > /tmp/r6_stamps.txt; grep -v BDBG "$R/err.txt" | tail -5; rm "$R/err.txt"
wc -l /tmp/r6_stamps.txt
grep -E '"what":"decode' "$R/r6_bench.txt" | head -3
python3 - /tmp/r6_stamps.txt <<'PY' | tee "$R/r6_summary.txt"
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
tail -120000 /tmp/r6_stamps.txt | gzip -9 > "$R/r6_stamps_tail.txt.gz"
