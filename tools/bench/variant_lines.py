#!/usr/bin/env python3
"""The lines of a run-variants.sh log side by side: for each measured line (rw-bench's JSON lines
that are not ceilings), one row per variant with its value in every round, so that variants
measured in turns in the same call can be read against each other.

    tools/bench/variant_lines.py out/variants.txt [--what REGEX]

The value is ms_per_step where the line has one (decode), else the median in ms; ratio is the
line's ratio to its same-run ceiling, vs_bf16 is printed where the line carries it (G3), and a
generate line's outputs digest after a #: variants that keep the bits show the same one."""
import argparse
import json
import re
import sys


def read(path):
    """[(variant, round, line dict)] in file order."""
    out, cur = [], None
    head = re.compile(r"^=== (\S+) (\d+)")
    with open(path) as f:
        for raw in f:
            m = head.match(raw)
            if m:
                cur = (m.group(1), int(m.group(2)))
                continue
            if cur is None or not raw.startswith("{"):
                continue
            try:
                j = json.loads(raw)
            except json.JSONDecodeError:
                continue
            out.append((cur[0], cur[1], j))
    return out


def key(j):
    parts = [j.get("what", "?")]
    for k in ("batch", "ctx"):
        if k in j:
            parts.append(f"{k[0]}{j[k]}")
    return " ".join(parts)


def cell(j):
    if "ms_per_step" in j:
        s = f"{j['ms_per_step']:.3f} ms"
    elif j.get("median_s") is not None:
        s = f"{1e3 * j['median_s']:.3f} ms"
    else:
        return "-"
    if j.get("ratio") is not None:
        s += f" r{j['ratio']:.3f}"
    if j.get("vs_bf16") is not None:
        s += f" x{j['vs_bf16']:.3f}"
    if j.get("outputs_digest"):
        s += f" #{j['outputs_digest']}"
    return s


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("log", help="run-variants.sh's variants.txt")
    ap.add_argument("--what", default="", help="only lines whose 'what' matches this regex")
    a = ap.parse_args()
    rows = read(a.log)
    if not rows:
        sys.exit(f"variant_lines: no measured lines in {a.log}")
    table, order, variants = {}, [], []
    for v, r, j in rows:
        if j.get("role") == "ceiling" or "what" not in j:
            continue
        if a.what and not re.search(a.what, j["what"]):
            continue
        k = key(j)
        if k not in table:
            table[k] = {}
            order.append(k)
        if v not in variants:
            variants.append(v)
        table[k].setdefault(v, []).append(cell(j))
    w = max(len(v) for v in variants) if variants else 8
    for k in order:
        print(k)
        for v in variants:
            if v in table[k]:
                print(f"  {v:<{w}}  " + "  |  ".join(table[k][v]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
