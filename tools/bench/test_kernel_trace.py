#!/usr/bin/env python3
"""test_kernel_trace.py - kernel_trace.py on a synthetic trace (testdata/ktrace.csv, numbers made up
for the test): a kernel outside graphs, a graph launched three times whose kernels overlap as
programmatic launch lets them, and a graph launched once. Checks the graph table, the busy and
span medians (the spans add up to the step), end-order sequences, and clear errors on a graph
with too few launches and on a file that is not a trace."""
import os
import subprocess
import sys

from checklib import check, finish, run_on_text

here = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
tool = os.path.join(here, "kernel_trace.py")
trace = os.path.join(here, "testdata", "ktrace.csv")

r = subprocess.run([sys.executable, tool, trace, "--sequence", "3", "--no-demangle"],
                   capture_output=True, text=True)
check(r.returncode == 0, f"exit status {r.returncode}: {r.stderr}")
out = r.stdout.splitlines()
check(out[:1] == ["11 kernels, 10 of them in 2 graphs"], f"summary line: {out[:1]}")
check(any(l.split() == ["5", "3", "3", "0.0090"] for l in out), "graph 5: 3 kernels, 3 launches, 9 us")
check(not any(l.split()[:1] == ["7"] for l in out), "graph 7 (one launch) is left out")
check("graph 5: 3 instances, span 9.0 us (median)" in out, "the chosen graph's span")
rows = {l.split()[4]: l.split()[:4] for l in out if "(" in l and l.split()[0] == "1"}
check(rows.get("_Z4gemvPKf") == ["1", "4.5", "4.0", "4.00"], f"gemv: busy 4.5, span 4.0: {rows}")
check(rows.get("_Z4normv") == ["1", "2.0", "2.0", "2.00"], "norm: its own time")
check(rows.get("_Z15moe_gemm_kernelILi16ELi0EEvv") == ["1", "4.0", "3.0", "3.00"],
      "the medians of the expert kernel over its three launches (one of them longer)")
spans = [float(l.split()[2]) for l in out if "(" in l and l.split()[0] == "1"]
check(abs(sum(spans) - 9.0) < 1e-9, f"the spans add up to the step: {spans}")
seq = out[-3:]
check([l.split()[2] for l in seq] == ["_Z4normv", "_Z4gemvPKf", "_Z15moe_gemm_kernelILi16ELi0EEvv"],
      f"end order: {seq}")
r = subprocess.run([sys.executable, tool, trace, "--graph", "7"], capture_output=True, text=True)
check(r.returncode != 0 and "fewer than 3 instances" in r.stderr, "a graph launched once is refused")
r = run_on_text(tool, "a,b\n1,2\n")
check(r.returncode != 0 and "not kernel-trace.sh's CSV" in r.stderr, "a file that is not a trace")
finish("test_kernel_trace")
