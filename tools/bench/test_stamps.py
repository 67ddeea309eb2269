#!/usr/bin/env python3
"""test_stamps.py - stamps.py on synthetic stamp records (numbers made up for the test): two
layers of a 2-CTA kernel A and a 3-CTA kernel B with a mid point, among lines that are not
stamps. Checks the launches found, the medians of wait-to-end and wait-to-mid, the gap table,
the timeline around B's last launch, and clear errors on a file without stamps and on an
unknown kernel."""
import os
import subprocess
import sys
import tempfile

from checklib import check, finish, run_on_text

here = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
tool = os.path.join(here, "stamps.py")


def rec(k, cta, e, w, m, x):
    return f"RW_STAMP {k} cta {cta} entry {e} wait {w} mid {m} end {x}\n"


text = "rw-bench: --- decode ---\n"
for base in (0, 20000):  # two layers, 20 us apart; layer 2's A ends 0.4 us before B waits
    text += rec("A", 0, base, base + 1000, 0, base + 5000)
    text += rec("A", 1, base, base + 1000, 0, base + 6000)
    bw = 6500 if base == 0 else 6400
    for c in range(3):
        text += rec("B", c, base + 2000, base + bw + 100 * c, base + bw + 1500,
                    base + 9000 + 500 * c)
text += "{\"what\":\"decode_bf16\"}\n"
with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
    f.write(text)
try:
    r = subprocess.run([sys.executable, tool, f.name, "--around", "B", "--pick", "1",
                        "--before", "1", "--after", "0"], capture_output=True, text=True)
    check(r.returncode == 0, f"exit status {r.returncode}: {r.stderr}")
    out = r.stdout.splitlines()
    check(out[:1] == ["10 records, 4 launches"], f"summary line: {out[:1]}")
    rows = {l.split()[0]: l.split() for l in out if l.startswith("  ") and "wait-end" in l}
    check(rows.get("A") == ["A", "2", "2", "wait-end", "5.00"], f"A: 2 launches of 2 CTAs, 5 us: {rows}")
    check(rows.get("B", [])[:5] == ["B", "2", "3", "wait-end", "3.55"],
          f"B: 2 launches of 3 CTAs, 3.5 and 3.6 us: {rows.get('B')}")
    check(rows.get("B", [])[5:] == ["mid", "1.50"], f"B's mid 1.5 us after its wait: {rows.get('B')}")
    gaps = {tuple(l.split()[:3]): l.split()[3:] for l in out if "->" in l}
    check(gaps.get(("A", "->", "B")) == ["0.45", "0.40", "0.50", "2"], f"A -> B gaps: {gaps}")
    check(gaps.get(("B", "->", "A")) == ["11.00", "11.00", "11.00", "1"], f"B -> A gap: {gaps}")
    tl = [l.split() for l in out[out.index(next(l for l in out if l.startswith("timeline"))) + 1:]]
    check([t[0] for t in tl] == ["A", "B"], f"the timeline: A then B: {tl}")
    check(tl and tl[0][:4] == ["A", "2", "entry", "-6.40"], f"A's entry from B's wait: {tl[:1]}")
    check(len(tl) > 1 and tl[1][5:8] == ["0.00", "0.10", "0.20"], f"B's wait returns: {tl[1:]}")
    check(len(tl) > 1 and tl[1][9:12] == ["2.60", "3.10", "3.60"] and tl[1][13] == "0.40",
          f"B's ends and its gap: {tl[1:]}")
    r = subprocess.run([sys.executable, tool, f.name, "--around", "C"], capture_output=True,
                       text=True)
    check(r.returncode != 0 and "no launch of C" in r.stderr, f"unknown kernel: {r.stderr}")
finally:
    os.unlink(f.name)
# a launch passing its wait in two waves 5 us apart: two launches by the default rule, one with
# --split W=10 (and the other kernels' rule unchanged); a malformed --split refused
waves = rec("W", 0, 0, 1000, 0, 4000) + rec("W", 1, 0, 1100, 0, 4100) + \
    rec("W", 2, 4000, 6100, 0, 9000) + rec("V", 0, 9000, 9500, 0, 9900) + \
    rec("V", 1, 9000, 13500, 0, 13900)
for args, want in (([], {"W": "2", "V": "2"}), (["--split", "W=10"], {"W": "1", "V": "2"}),
                   (["--split", "10"], {"W": "1", "V": "1"})):
    r = run_on_text(tool, waves, suffix=".txt", args=args)
    rows = {l.split()[0]: l.split()[1] for l in r.stdout.splitlines()
            if l.startswith("  ") and "wait-end" in l}
    check(r.returncode == 0 and rows == want, f"--split {args}: launches {rows}, want {want}")
r = run_on_text(tool, waves, suffix=".txt", args=["--split", "W=x"])
check(r.returncode != 0 and "not a number" in r.stderr, f"--split W=x: {r.stderr}")
r = run_on_text(tool, "nothing here\n", suffix=".txt")
check(r.returncode != 0 and "no RW_STAMP lines" in r.stderr, f"a file without stamps: {r.stderr}")
finish("test_stamps")
