#!/usr/bin/env bash
# Session 35, call 4: where a one-token layer's kernel boundaries go. globaltimer stamps
# (bstamps.patch, a diagnostic build) of every CTA of the q/k/v and o_proj GEMVs and the two
# expert passes, and of the router's routing CTA, over a few layers of a b1 x 1k step: each
# kernel's first entry, its launch wait's return, its last end; the gap from one kernel's last
# CTA end to the next one's wait return is the boundary's cost. Archive: pack-variants
# bstamps=bstamps.patch.
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R" /tmp/rw-variants
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader > "$R/r4_gpu.txt"
tar xJf .gpu-pack/variants.txz -C /tmp/rw-variants
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
timeout 90 /tmp/rw-variants/rw-bstamps $C decode --batches 1 --ctxs 1024 --steps 20 --gen 1,16,2 \
    --gen-reps 1 --no-quant --no-forward 2>&1 | grep BDBG > "$R/r4_stamps.txt"
wc -l "$R/r4_stamps.txt"
python3 - "$R/r4_stamps.txt" <<'PY' | tee "$R/r4_summary.txt"
import re, sys, collections, statistics
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    m = re.match(r"BDBG (\w+) L (\d+) cta (\d+) entry (\d+) wait (\d+) mid (\d+) end (\d+)", line)
    if m:
        runs[(m.group(1), int(m.group(2)))].append([int(v) for v in m.groups()[3:]])
L = []
for (k, l), rows in runs.items():
    e = [r[0] for r in rows]; w = [r[1] for r in rows]; x = [r[3] for r in rows]
    L.append(dict(k=k, l=l, n=len(rows), e0=min(e), w0=min(w), wm=statistics.median(w),
                  w1=max(w), x0=min(x), xm=statistics.median(x), x1=max(x),
                  mid=rows[0][2]))
L.sort(key=lambda d: d["w0"])
routers = [d for d in L if d["k"] == "router"]
for r in routers[:4]:
    t0 = r["w0"]
    print(f"router L {r['l']}: us from its wait's return (kernel: CTAs, first entry, wait "
          f"min/median/max, end min/median/max; gap = this wait min - previous end max)")
    prev = None
    for d in L:
        if -40e3 <= d["w0"] - t0 <= 60e3:
            f = lambda v: f"{(v - t0) / 1e3:7.2f}"
            gap = f"{(d['w0'] - prev['x1']) / 1e3:6.2f}" if prev else "     -"
            print(f"  {d['k']:6s} {d['n']:4d}  entry {f(d['e0'])}  wait {f(d['w0'])} {f(d['wm'])} "
                  f"{f(d['w1'])}  end {f(d['x0'])} {f(d['xm'])} {f(d['x1'])}  gap {gap}"
                  + (f"  (logits {f(d['mid'])})" if d["k"] == "router" else ""))
            prev = d
PY
