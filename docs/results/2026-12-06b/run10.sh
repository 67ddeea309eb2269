#!/usr/bin/env bash
# Session 34, call 10: where the one-token GEMVs' time goes inside a step. stamps =
# gvstamps.patch: every CTA of three o_proj and three q/k/v launches of one-token steps prints
# globaltimer stamps (entry, PDL wait returned, x staged, first stage arrived, slice done, end).
# A b1 x 1k decode run; the GVDBG lines go to r10_stamps.txt, summarized by r10_summary.txt.
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R" /tmp/rw-variants
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader > "$R/r10_gpu.txt"
tar xJf .gpu-pack/variants.txz -C /tmp/rw-variants
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
timeout 60 /tmp/rw-variants/rw-stamps $C decode --batches 1 --ctxs 1024 --steps 20 --gen 1,16,2 \
    --gen-reps 1 --no-quant --no-forward > /tmp/r10.out 2>&1
grep GVDBG /tmp/r10.out > "$R/r10_stamps.txt"
grep -v GVDBG /tmp/r10.out | tail -5
python3 - "$R/r10_stamps.txt" <<'PY' | tee "$R/r10_summary.txt"
import re, sys, collections
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    m = re.match(r"GVDBG (\w+) L (\d+) cta (\d+) entry (\d+) wait (\d+) x (\d+) first (\d+) kdone (\d+) end (\d+)", line)
    if m:
        k, L = m.group(1), int(m.group(2))
        runs[(k, L)].append([int(v) for v in m.groups()[2:]])
for (k, L), rows in sorted(runs.items()):
    e0 = min(r[1] for r in rows)
    ab = lambda i: sorted(r[1] + r[i] - e0 if i > 1 else r[1] - e0 for r in rows)
    def q(v): return f"{v[0]/1e3:.2f}/{v[len(v)//2]/1e3:.2f}/{v[-1]/1e3:.2f}"
    print(f"{k} launch {L}: {len(rows)} CTAs, us from the first CTA's entry (min/median/max):")
    for name, i in (("entry", 1), ("wait returned", 2), ("x staged", 3), ("first stage", 4), ("slice done", 5), ("end", 6)):
        print(f"  {name:14s} {q(ab(i))}")
PY
