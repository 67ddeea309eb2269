#!/usr/bin/env python3
"""kernel_trace.py - where a graphed step's time goes, kernel by kernel, from kernel-trace.sh's CSV.

tools/gpu/kernel-trace.sh records every kernel's start and end as it ran (CUPTI), graph id and
node id included. Each launch of a CUDA graph is one instance of it: its kernels from the first
node to the node seen again. For every graph launched at least --min-instances times this prints
the number of kernels an instance, the instances, and the median span (first start to last end);
then, for one graph (--graph G, else the one with the most instances), per kernel name and grid:
launches an instance, and the medians over instances of two sums:

  busy   the kernels' own times, end - start (with programmatic launch a kernel starts before
         the one ahead of it ends, so busy times overlap and add up to more than the span);
  span   each kernel's share of the span: its end minus the end before it, the kernels of an
         instance taken in the order they end (the first from its own start). These add up to
         the span exactly, so they say which kernels the step waits for.

and span a launch, that span divided by the kernel's launches in an instance (a layer's share
when the kernel runs once a layer).

    kernel_trace.py FILE.csv [--graph G] [--min-instances N] [--sequence N] [--phases]
                    [--no-demangle]

--phases also sums the chosen graph's span shares and busy times by phase, the issue's per-phase
rows (medians over instances): attention (atc_*), experts (the expert GEMMs, their sort and
combine), dense (the q/k/v and o_proj GEMMs, and the dequantization of quantized attention
weights), lm_head (the last dense GEMM an instance launches) and other (norms, the router,
RoPE, embedding, sampling: everything else).

--sequence N also prints the first N kernels of the chosen graph's median instance with their
busy and span times. Names are demangled with c++filt when it is on PATH, and shortened to the
function and its template arguments.
"""
import argparse
import collections
import csv
import shutil
import statistics
import subprocess
import sys


def load(path):
    """The CSV's kernels as dicts, start order."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if rows and "start_ns" not in rows[0]:
        sys.exit(f"kernel_trace: {path} is not kernel-trace.sh's CSV")
    ks = []
    for r in rows:
        ks.append({"start": int(r["start_ns"]), "end": int(r["end_ns"]), "graph": int(r["graph"]),
                   "node": int(r["node"]), "stream": int(r["stream"]),
                   "grid": (int(r["grid_x"]), int(r["grid_y"]), int(r["grid_z"])),
                   "name": r["name"]})
    ks.sort(key=lambda k: k["start"])
    return ks


def demangle(names):
    """{mangled: readable} through c++filt, or the names as they are without it."""
    names = sorted(set(names))
    if not shutil.which("c++filt"):
        return {n: n for n in names}
    res = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True)
    out = res.stdout.split("\n")
    return {n: (out[i] if i < len(out) and out[i] else n) for i, n in enumerate(names)}


def short(name):
    """The function with its template arguments, without its parameter list."""
    depth = 0
    for i, c in enumerate(name):
        if c == "<":
            depth += 1
        elif c == ">":
            depth -= 1
        elif c == "(" and depth == 0 and i > 0:
            return name[:i].replace("void ", "", 1) if name.startswith("void ") else name[:i]
    return name


def instances(ks):
    """A graph's kernels (start order) cut into launches: a new one where a node id repeats."""
    out, cur, seen = [], [], set()
    for k in ks:
        if k["node"] in seen:
            out.append(cur)
            cur, seen = [], set()
        cur.append(k)
        seen.add(k["node"])
    if cur:
        out.append(cur)
    return out


def shares(inst):
    """(kernel, busy, span share) for an instance, in end order; the shares add up to the span."""
    order = sorted(inst, key=lambda k: k["end"])
    out, prev = [], None
    for k in order:
        share = k["end"] - (prev if prev is not None else k["start"])
        out.append((k, k["end"] - k["start"], max(share, 0)))
        prev = k["end"] if prev is None else max(prev, k["end"])
    return out


# phase of a kernel by its name, first match wins: the attention kernels' names start with atc_,
# and moe_gemm_kernel must be an expert GEMM before gemm_kernel can be a dense one. The dense
# GEMMs are GEMM_KEYS' kernels; the last of an instance is the lm_head.
GEMM_KEYS = ("gemv", "gemm_kernel")
PHASES = (("attention", ("atc_",)),
          ("experts", ("moe_gemm_kernel", "sort_kernel", "combine_kernel")),
          ("dense", GEMM_KEYS + ("dequant",)))
PHASE_ORDER = ("attention", "experts", "dense", "lm_head", "other")


def phase_of(name):
    """attention, experts, dense or other, from the kernel's (short) name."""
    for phase, keys in PHASES:
        if any(k in name for k in keys):
            return phase
    return "other"


def phase_shares(inst, names):
    """{phase: (busy, span share)} of one instance (start order); its last dense GEMM is the
    lm_head."""
    phase = {id(k): phase_of(short(names[k["name"]])) for k in inst}
    gemms = [k for k in inst if phase[id(k)] == "dense"
             and any(g in names[k["name"]] for g in GEMM_KEYS)]
    if gemms:
        phase[id(gemms[-1])] = "lm_head"
    out = {p: [0, 0] for p in PHASE_ORDER}
    for k, busy, share in shares(inst):
        out[phase[id(k)]][0] += busy
        out[phase[id(k)]][1] += share
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--graph", type=int)
    ap.add_argument("--min-instances", type=int, default=3)
    ap.add_argument("--sequence", type=int, default=0)
    ap.add_argument("--phases", action="store_true")
    ap.add_argument("--no-demangle", action="store_true")
    a = ap.parse_args(argv)
    ks = load(a.csv)
    names = {n: n for n in {k["name"] for k in ks}} if a.no_demangle else demangle(
        [k["name"] for k in ks])
    graphs = collections.defaultdict(list)
    for k in ks:
        if k["graph"]:
            graphs[k["graph"]].append(k)
    table = {}
    for g, gk in graphs.items():
        insts = instances(gk)
        if len(insts) >= a.min_instances:
            table[g] = insts
    print(f"{len(ks)} kernels, {sum(len(v) for v in graphs.values())} of them in {len(graphs)} graphs")
    if not table:
        print(f"no graph launched {a.min_instances} times or more")
        return 1
    print("  graph  kernels  instances  span ms (median)")
    for g, insts in sorted(table.items()):
        span = statistics.median(max(k["end"] for k in i) - min(k["start"] for k in i) for i in insts)
        print(f"  {g:5d}  {statistics.median(len(i) for i in insts):7.0f}  {len(insts):9d}  {span / 1e6:.4f}")
    g = a.graph if a.graph is not None else max(table, key=lambda x: (len(table[x]), x))
    if g not in table:
        sys.exit(f"kernel_trace: graph {g} has fewer than {a.min_instances} instances")
    insts = table[g]
    per = collections.defaultdict(lambda: [[], [], []])  # key -> launches, busy, span per instance
    for i in insts:
        acc = collections.defaultdict(lambda: [0, 0, 0])
        for k, busy, share in shares(i):
            key = (short(names[k["name"]]), k["grid"])
            acc[key][0] += 1
            acc[key][1] += busy
            acc[key][2] += share
        for key, (n, b, s) in acc.items():
            per[key][0].append(n)
            per[key][1].append(b)
            per[key][2].append(s)
    total = statistics.median(sum(s for _, _, s in shares(i)) for i in insts)
    print(f"graph {g}: {len(insts)} instances, span {total / 1e3:.1f} us (median)")
    print("  launches    busy us    span us  span a launch  kernel  grid")
    for key, (n, b, s) in sorted(per.items(), key=lambda kv: -statistics.median(kv[1][2])):
        launches, span = statistics.median(n), statistics.median(s) / 1e3
        print(f"  {launches:8.0f}  {statistics.median(b) / 1e3:9.1f}  {span:9.1f}  "
              f"{span / launches:13.2f}  {key[0]}  {key[1]}")
    if a.phases:
        per_inst = [phase_shares(i, names) for i in insts]
        print("per phase (medians over instances; an instance's spans add up to its step):")
        print("  phase        busy us    span us   of the span")
        for p in PHASE_ORDER:
            busy = statistics.median(x[p][0] for x in per_inst)
            span = statistics.median(x[p][1] for x in per_inst)
            print(f"  {p:10s} {busy / 1e3:9.1f}  {span / 1e3:9.1f}   {100 * span / total:5.1f}%")
    if a.sequence:
        mid = sorted(insts, key=lambda i: max(k["end"] for k in i) - min(k["start"] for k in i))
        inst = mid[len(mid) // 2]
        print(f"the first {a.sequence} kernels of its median instance, end order (busy, span us):")
        for k, busy, share in shares(inst)[: a.sequence]:
            print(f"  {busy / 1e3:7.2f}  {share / 1e3:7.2f}  {short(names[k['name']])}  {k['grid']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
