#!/usr/bin/env python3
"""test_phase_table.py - phase_table.py on synthetic lines (testdata/phase_table.jsonl, numbers made
up for the test): three breakdown columns (decode b256 and b1 at 1k, prefill 8 x 2k), the dense
GEMMs' cuBLASLt times, torch's SDPA on two backends (the faster is taken) and expert layers, a peer
line with an error (that peer is "not run"), and a line that is not JSON. Checks each cell that
the tool computes (peer per layer x 48, the rw phases summed into rows, "other" as the rest), and
a clear error on a file without breakdown lines."""
import os
import subprocess
import sys

from checklib import check, finish, run_on_text

here = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
tool = os.path.join(here, "phase_table.py")
data = os.path.join(here, "testdata", "phase_table.jsonl")

r = subprocess.run([sys.executable, tool, data], capture_output=True, text=True)
check(r.returncode == 0, f"exit status {r.returncode}: {r.stderr}")
rows = {}
for line in r.stdout.splitlines():
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    rows[cells[0]] = cells[1:]
head = rows.get("phase", [])
check(head[0::2] == ["decode b256 x 1024: rw", "decode b1 x 1024: rw", "prefill 8 x 2048: rw"],
      f"the columns, in the order read: {head}")
att = rows.get("attention", [])
check(att == ["6.00 ms", "6.24 ms (torch SDPA)", "0.36 ms", "not run", "140.00 ms",
              "26.40 ms (torch SDPA)"],
      f"attention: the faster backend x 48 (cuDNN 130 us, prefill 550 us), an errored peer not run: {att}")
exp = rows.get("experts", [])
check(exp[1] == "36.48 ms (torch grouped_mm)" and exp[5] == "312.00 ms (torch grouped_mm)",
      f"experts: the layer at the step's tokens (256; 8 x 2048 = 16384) x 48: {exp}")
den = rows.get("dense (q/k/v + o_proj)", [])
check(den[0] == "2.20 ms" and den[1] == "1.68 ms (cuBLASLt)" and den[4] == "110.00 ms",
      f"dense: rw q/k/v + o_proj, peer (20 + 15 us) x 48: {den}")
lm = rows.get("lm_head", [])
check(lm[1] == "0.25 ms (cuBLASLt)" and lm[5] == "0.15 ms (cuBLASLt)",
      f"lm_head: once a step, at 256 rows and at the prefill's 8 scored rows: {lm}")
oth = rows.get("other (norms, router, RoPE + KV write, embedding)", [])
check(oth[0] == "1.51 ms" and oth[2] == "0.64 ms" and oth[4] == "25.10 ms",
      f"other: every phase not in a row above: {oth}")
fwd = rows.get("forward (with the profiler's events)", [])
check(fwd[0::2] == ["25.20 ms", "2.90 ms", "546.00 ms"], f"forward: {fwd}")
r = run_on_text(tool, '{"bench": "peer_kernels", "what": "experts_t1", "seconds": 1}\n', ".jsonl")
check(r.returncode == 1 and "no breakdown lines" in r.stderr, f"no breakdown: {r.returncode} {r.stderr}")
finish("test_phase_table")
