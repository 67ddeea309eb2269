#!/usr/bin/env python3
"""stamps.py - a timeline of kernel launches from the stamps build's records (core/stamps.cuh).

A build configured with -Dstamps=true has the forward pass's kernels record, for each CTA, its
entry, the return of its launch wait, an optional mid point and its end (%globaltimer, ns), and
prints them at exit to stderr, one line a record:

    RW_STAMP <kernel> cta <c> entry <ns> wait <ns> mid <ns> end <ns>

Other lines are ignored, so the program's whole stderr can be given. Records of one kernel name
are one launch while their wait returns lie within --split us of each other (the CTAs of a launch
pass their wait together; the next launch of the same kernel is a layer later). A launch of more
CTAs than the GPU holds at once passes its wait in waves: --split NAME=US (repeatable) sets the
rule for that kernel alone, wide enough to take its waves as one launch (the expert passes at
b256: --split w13=100 --split w2=100). Then:

  launches     the launches found, by kernel: their count, CTAs a launch, and the medians of
               wait (first wait return to last CTA end) and, where recorded, mid (first wait
               return to the mid point's median);
  gaps         for each pair of kernels that follow each other (the next launch's first wait
               return within 50 us of this one's last end): median, min and max of that gap;
  timeline     with --around NAME, the launches around one launch of NAME (the --pick-th from
               the end, default the middle one), each as CTAs, first entry, wait returns (min,
               median, max) and ends (min, median, max), in us from that launch's first wait
               return, and its gap from the launch before.

    stamps.py FILE [--around NAME] [--pick N] [--before B] [--after A] [--split US]
              [--split NAME=US ...]
"""
import argparse
import collections
import re
import statistics
import sys

LINE = re.compile(r"RW_STAMP (\S+) cta (\d+) entry (\d+) wait (\d+) mid (\d+) end (\d+)")


def read(f):
    recs = collections.defaultdict(list)
    for line in f:
        m = LINE.search(line)
        if m:
            recs[m.group(1)].append(tuple(int(v) for v in m.groups()[1:]))
    return recs


def launches(recs, split_ns):
    """split_ns: kernel name -> ns between wait returns that start a new launch"""
    out = []
    for name, rows in recs.items():
        rows.sort(key=lambda r: r[2])
        cur = []
        for r in rows + [None]:
            if cur and (r is None or r[2] - cur[-1][2] > split_ns(name)):
                waits = [x[2] for x in cur]
                ends = [x[4] for x in cur]
                mids = [x[3] for x in cur if x[3]]
                out.append(dict(k=name, n=len(cur), e0=min(x[1] for x in cur), w0=min(waits),
                                wm=statistics.median(waits), w1=max(waits), x0=min(ends),
                                xm=statistics.median(ends), x1=max(ends),
                                mid=statistics.median(mids) if mids else None))
                cur = []
            if r is not None:
                cur.append(r)
    out.sort(key=lambda d: d["w0"])
    return out


def us(v):
    return f"{v / 1e3:8.2f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("file", help="the stamps build's stderr (or any text holding RW_STAMP lines)")
    ap.add_argument("--around", help="print the timeline around a launch of this kernel")
    ap.add_argument("--pick", type=int, default=0,
                    help="which launch of --around, counted from the last (default: the middle)")
    ap.add_argument("--before", type=int, default=9, help="launches shown before it")
    ap.add_argument("--after", type=int, default=3, help="launches shown after it")
    ap.add_argument("--split", action="append", default=[],
                    help="us between wait returns that start a new launch of a kernel (default "
                    "3), or NAME=US for kernel NAME alone; repeatable")
    a = ap.parse_args()
    split_all, split_by = 3.0, {}
    for v in a.split:
        name, eq, val = v.rpartition("=")
        try:
            us_ = float(val)
        except ValueError:
            sys.exit(f"stamps: --split {v}: not a number of us (US or NAME=US)")
        if eq:
            split_by[name] = us_
        else:
            split_all = us_
    with open(a.file, errors="replace") as f:
        recs = read(f)
    if not recs:
        sys.exit(f"stamps: no RW_STAMP lines in {a.file} (a build configured with -Dstamps=true "
                 "prints them to stderr at exit)")
    L = launches(recs, lambda k: split_by.get(k, split_all) * 1e3)
    print(f"{sum(len(v) for v in recs.values())} records, {len(L)} launches")
    print("launches by kernel: count, CTAs a launch (median), wait to last end and wait to mid "
          "(us, medians)")
    by = collections.defaultdict(list)
    for d in L:
        by[d["k"]].append(d)
    for k in sorted(by):
        v = by[k]
        mids = [d["mid"] - d["w0"] for d in v if d["mid"] is not None]
        mid = f"  mid {statistics.median(mids) / 1e3:7.2f}" if mids else ""
        print(f"  {k:10s} {len(v):6d} {statistics.median(d['n'] for d in v):6.0f}"
              f"  wait-end {statistics.median(d['x1'] - d['w0'] for d in v) / 1e3:7.2f}{mid}")
    gaps = collections.defaultdict(list)
    for prev, d in zip(L, L[1:]):
        g = d["w0"] - prev["x1"]
        if g < 50e3:
            gaps[(prev["k"], d["k"])].append(g / 1e3)
    print("gaps: a launch's last CTA end to the next launch's first wait return, us "
          "(median, min, max, count)")
    for (p, k), v in sorted(gaps.items()):
        print(f"  {p:10s} -> {k:10s} {statistics.median(v):7.2f} {min(v):7.2f} {max(v):7.2f}"
              f" {len(v):6d}")
    if a.around:
        idx = [i for i, d in enumerate(L) if d["k"] == a.around]
        if not idx:
            sys.exit(f"stamps: no launch of {a.around} (kernels: {', '.join(sorted(by))})")
        if a.pick > len(idx):
            sys.exit(f"stamps: --pick {a.pick}, but {a.around} has {len(idx)} launches")
        ri = idx[-a.pick] if a.pick > 0 else idx[len(idx) // 2]
        t0 = L[ri]["w0"]
        print(f"timeline around a launch of {a.around}, us from its first wait return: CTAs, "
              "first entry, wait min / median / max, end min / median / max, gap")
        prev = None
        for d in L[max(0, ri - a.before): ri + a.after + 1]:
            gap = us(d["w0"] - prev["x1"]) if prev else "       -"
            mid = f"  mid {us(d['mid'] - t0)}" if d["mid"] is not None else ""
            print(f"  {d['k']:10s} {d['n']:5d}  entry {us(d['e0'] - t0)}  wait {us(d['w0'] - t0)}"
                  f" {us(d['wm'] - t0)} {us(d['w1'] - t0)}  end {us(d['x0'] - t0)}"
                  f" {us(d['xm'] - t0)} {us(d['x1'] - t0)}  gap {gap}{mid}")
            prev = d


if __name__ == "__main__":
    main()
