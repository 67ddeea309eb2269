#!/usr/bin/env python3
"""kernel_times.py - per-kernel GPU time of one forward step, from an Nsight Compute CSV.

Reads the CSV that `ncu --csv --page raw --metrics gpu__time_duration.sum` prints (tools/gpu/
kernel-times.sh runs it on rw-bench), keeps its rows (other lines of the program's output are
skipped) and prints the number of kernels and their summed time, then, per kernel name and grid,
the launches, the total and the mean time, largest first. Each kernel is timed alone by ncu (launches serialized), so
the sum set beside the step time of the same build says how much of a step is kernels and how
much the gaps between them.

    kernel_times.py FILE.csv [--sequence N] [--step S]

--sequence N also prints the first N kernels in launch order. --step S keeps the S-th profiled
step alone (from 1) when the CSV holds several: a decode run with the mxfp8 model profiles the
bf16 step and then the mxfp8 one (tools/gpu/kernel-times.sh --quant). A step starts at its
embedding kernel, the first launch of every forward pass.
"""
import argparse
import collections
import csv
import sys


def rows(path):
    """(kernel, grid, microseconds) for every profiled kernel of the CSV, in launch order."""
    lines = [l for l in open(path, errors="replace") if l.startswith('"')]
    table = list(csv.reader(lines))
    if not table:
        return []
    head = table[0]
    try:
        ki, gi, ti = (head.index("Kernel Name"), head.index("Grid Size"),
                      head.index("gpu__time_duration.sum"))
    except ValueError as e:
        sys.exit(f"kernel_times: {path} is not an ncu raw CSV with gpu__time_duration.sum ({e})")
    unit = table[1][ti] if len(table) > 1 else "ns"  # the row under the header names the units
    scale = {"ns": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}.get(unit, 1e-3)
    out = []
    for r in table[1:]:
        try:
            t = float(r[ti].replace(",", ""))  # ncu prints thousands separators
        except (ValueError, IndexError):
            continue  # the units row
        us = t * scale
        name = r[ki].rsplit("(", 1)[0].replace("void ", "").strip()  # drop the parameter list
        out.append((name, r[gi], us))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--sequence", type=int, default=0)
    ap.add_argument("--step", type=int, default=0)
    a = ap.parse_args()
    rs = rows(a.csv)
    if not rs:
        sys.exit(f"kernel_times: no profiled kernels in {a.csv}")
    if a.step:
        starts = [i for i, (name, _, _) in enumerate(rs) if name.endswith("embed_kernel")]
        if not 1 <= a.step <= len(starts):
            sys.exit(f"kernel_times: --step {a.step}: {a.csv} holds {len(starts)} profiled "
                     "step(s) (a step starts at embed_kernel)")
        end = starts[a.step] if a.step < len(starts) else len(rs)
        rs = rs[starts[a.step - 1]:end]
    tot = collections.OrderedDict()
    cnt = collections.Counter()
    for name, grid, us in rs:
        key = (name, grid)
        tot[key] = tot.get(key, 0.0) + us
        cnt[key] += 1
    print(f"{len(rs)} kernels, {sum(us for _, _, us in rs):.1f} us in all")
    print(f"{'total us':>10} {'launches':>9} {'mean us':>9}  kernel  grid")
    for (name, grid), us in sorted(tot.items(), key=lambda kv: -kv[1]):
        n = cnt[(name, grid)]
        print(f"{us:10.1f} {n:9d} {us / n:9.2f}  {name}  {grid}")
    if a.sequence:
        print("first kernels in launch order:")
        for name, grid, us in rs[:a.sequence]:
            print(f"{us:9.2f}  {name}  {grid}")


if __name__ == "__main__":
    main()
