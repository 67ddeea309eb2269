#!/usr/bin/env python3
"""The tile sweep's lines (r13_sweep.txt) as one table: a row per forced tile (BN,TN,FOLD; "rule"
is the tree's own choice), a column per GEMM and token count, each cell the median in us."""
import collections
import json
import sys

d = collections.defaultdict(dict)
label = None
for line in open(sys.argv[1] if len(sys.argv) > 1 else "r13_sweep.txt"):
    if line.startswith("=== "):
        label = line[4:].strip()
        continue
    try:
        j = json.loads(line)
    except ValueError:
        continue
    if "median_s" in j:
        d[j["what"]][label] = j["median_s"] * 1e6
labels = []
for w in d:
    for lab in d[w]:
        if lab not in labels:
            labels.append(lab)
whats = sorted(d, key=lambda w: (w.split("_m")[0], int(w.split("_m")[1])))
short = [w.replace("dense_", "").replace("lm_head", "lm").replace("o_proj", "o") for w in whats]
print("%-10s" % "tile" + "".join("%9s" % s for s in short))
for lab in labels:
    print("%-10s" % lab + "".join("%9.1f" % d[w][lab] if lab in d[w] else "%9s" % "-" for w in whats))
