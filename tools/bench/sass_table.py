#!/usr/bin/env python3
"""sass_table.py - where a kernel's instructions and stalls go, from Nsight Compute's SASS page.

Reads the CSV that `ncu --import REPORT --page source --csv --print-source sass` prints (tools/gpu/
kernel-profile.sh makes one), which holds, for each profiled kernel, a "Kernel Name" line, a header
and one row per SASS instruction with how often it executed and how many warp-stall samples
landed on it. For each kernel it prints:

- the instructions executed (warp level) and the stall samples in all;
- per opcode (the mnemonic before its first '.', predicate dropped): its share of the executed
  instructions and of the stall samples, largest first;
- the instructions grouped by how often each executed, with their share of the instructions and
  of the stall samples: a loop body's instructions share one count, so the groups read as "this
  many instructions an iteration, this many iterations, this much of the waiting";
- the TOP instructions with the most stall samples: what the warps waited on.

    sass_table.py FILE.csv [--kernel N] [--top K] [--ops K] [--groups K]

--kernel N keeps the N-th kernel of the file (from 1; default all).
"""
import argparse
import collections
import csv
import sys


def number(s):
    """An ncu count ('1,234' or '1234'); '' or '-' as 0."""
    s = s.replace(",", "").strip()
    if s in ("", "-"):
        return 0
    return int(float(s))


def kernels(path):
    """[(name, [(address, sass, stall samples, executed)])] in the file's order."""
    out = []
    cur = None
    cols = None
    with open(path, newline="", errors="replace") as f:
        for row in csv.reader(f):
            if not row:
                continue
            if row[0] == "Kernel Name":
                cur = (row[1] if len(row) > 1 else "?", [])
                out.append(cur)
                cols = None
                continue
            if row[0] == "Address" and cur is not None:
                try:
                    cols = (row.index("Source"), row.index("Warp Stall Sampling (All Samples)"),
                            row.index("Instructions Executed"))
                except ValueError as e:
                    sys.exit(f"sass_table: {path}: a header without the columns it needs ({e})")
                continue
            if cur is None or cols is None or len(row) <= max(cols):
                continue
            si, ss, ie = cols
            cur[1].append((row[0], row[si].strip(), number(row[ss]), number(row[ie])))
    return [k for k in out if k[1]]


def opcode(sass):
    """The mnemonic of a SASS line: 'ISETP' of '@!P0 ISETP.NE.AND P0, ...'."""
    words = sass.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0] if words else "?"


def table(name, lines, top, ops, groups):
    instr = sum(l[3] for l in lines)
    stalls = sum(l[2] for l in lines)
    print(f"{name}")
    print(f"  {instr:,} instructions executed, {stalls:,} stall samples, {len(lines)} SASS lines")
    by_instr = collections.Counter()
    by_stall = collections.Counter()
    for _, sass, st, ex in lines:
        op = opcode(sass)
        by_instr[op] += ex
        by_stall[op] += st
    print("  opcode        instr %   stall %")
    for op, n in by_instr.most_common(ops):
        print(f"  {op:<12} {100.0 * n / max(instr, 1):7.1f}   {100.0 * by_stall[op] / max(stalls, 1):7.1f}")
    count = collections.Counter()
    group_stall = collections.Counter()
    for l in lines:
        if l[3]:
            count[l[3]] += 1
            group_stall[l[3]] += l[2]
    print("  executions  lines  instr %   stall %   (lines that executed equally often)")
    for ex, n in sorted(count.items(), key=lambda kv: -kv[0] * kv[1])[:groups]:
        print(f"  {ex:>10,}  {n:5d}  {100.0 * ex * n / max(instr, 1):7.1f}"
              f"   {100.0 * group_stall[ex] / max(stalls, 1):7.1f}")
    print("  most stall samples:")
    for addr, sass, st, ex in sorted(lines, key=lambda l: -l[2])[:top]:
        if st == 0:
            break
        print(f"  {addr[-6:]:>6}  {st:7,}  {ex:10,}  {sass}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--kernel", type=int, default=0, help="the N-th kernel only (from 1)")
    ap.add_argument("--top", type=int, default=12, help="stall lines to print")
    ap.add_argument("--ops", type=int, default=20, help="opcodes to print")
    ap.add_argument("--groups", type=int, default=8, help="execution-count groups to print")
    a = ap.parse_args()
    ks = kernels(a.csv)
    if not ks:
        sys.exit(f"sass_table: no SASS rows in {a.csv} (ncu --page source --csv --print-source sass)")
    if a.kernel:
        if a.kernel > len(ks):
            sys.exit(f"sass_table: {a.csv} holds {len(ks)} kernel(s), not {a.kernel}")
        ks = [ks[a.kernel - 1]]
    for i, (name, lines) in enumerate(ks):
        if i:
            print()
        table(name, lines, a.top, a.ops, a.groups)


if __name__ == "__main__":
    main()
