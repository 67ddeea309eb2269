#!/usr/bin/env python3
"""test_kernel_trace.py - kernel_trace.py on a synthetic trace (testdata/ktrace.csv, numbers made up
for the test): a kernel outside graphs, a graph launched three times whose kernels overlap as
programmatic launch lets them, and a graph launched once. Checks the graph table, the busy and
span medians (the spans add up to the step), end-order sequences, and clear errors on a graph
with too few launches and on a file that is not a trace. Then --phases on a second synthetic
trace (testdata/ktrace_phases.csv: one layer's kernels and an lm_head a step, three steps, the
second with a longer expert GEMM, o_proj's GEMV starting 1 us before the attention combine
ends): each phase's busy and span medians and its share of the step."""
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
phases = os.path.join(here, "testdata", "ktrace_phases.csv")
r = subprocess.run([sys.executable, tool, phases, "--phases", "--no-demangle"],
                   capture_output=True, text=True)
check(r.returncode == 0, f"--phases: exit status {r.returncode}: {r.stderr}")
out = r.stdout.splitlines()
check(any(l.startswith("per phase") for l in out), "--phases prints its table")
got = {l.split()[0]: l.split()[1:] for l in out if l.split()[:1] and l.split()[0] in
       ("attention", "experts", "dense", "lm_head", "other")}
check(got.get("attention") == ["9.0", "9.0", "14.1%"], f"attention: decode + combine: {got}")
check(got.get("experts") == ["21.0", "21.0", "32.8%"],
      "experts: w13 + w2, the median over steps (the second step's longer w13 left out)")
check(got.get("dense") == ["15.0", "14.0", "21.9%"],
      "dense: q/k/v + o_proj, o_proj's early start counted as busy, not as span")
check(got.get("lm_head") == ["3.0", "3.0", "4.7%"], "lm_head: the step's last dense GEMM")
check(got.get("other") == ["17.0", "17.0", "26.6%"],
      "other: the norms, RoPE, the router and sampling")
finish("test_kernel_trace")
