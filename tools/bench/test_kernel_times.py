#!/usr/bin/env python3
"""test_kernel_times.py - kernel_times.py on synthetic ncu CSVs (testdata/ncu_times.csv and
ncu_two_steps.csv, numbers made up for the test): rows among other output, thousands separators,
a template argument with parentheses, totals and means per kernel and grid, one step of two picked
by --step, and clear errors on a file without rows or a step it does not hold."""
import os
import subprocess
import sys

from checklib import check, finish, run_on_text

here = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
tool = os.path.join(here, "kernel_times.py")

r = subprocess.run([sys.executable, tool, os.path.join(here, "testdata", "ncu_times.csv"),
                    "--sequence", "2"], capture_output=True, text=True)
check(r.returncode == 0, f"exit status {r.returncode}: {r.stderr}")
out = r.stdout.splitlines()
check(out and out[0] == "4 kernels, 37.5 us in all", f"summary line: {out[:1]}")
check(any("16.5" in l and "gemm_kernel<64, 8, 4, 1, 1, (int)-1, 0>" in l and "(80, 1, 1)" in l
          for l in out), "q/k/v row with its whole template name and grid")
check(any(l.split()[:3] == ["10.0", "2", "5.00"] and "add_rmsnorm_kernel<8>" in l for l in out),
      "the two norms summed: 10 us, 2 launches, 5 us mean")
rows = [l for l in out if "kernel" in l and "us in all" not in l and "total us" not in l]
check(rows and "16.5" in rows[0], "largest first")
check(out[-2:] == ["     4.00  add_rmsnorm_kernel<8>  (1, 1, 1)",
                   "    16.50  gemm_kernel<64, 8, 4, 1, 1, (int)-1, 0>  (80, 1, 1)"],
      f"launch order: {out[-2:]}")
# two profiled steps (bf16, then mxfp8): --step picks one, each starting at its embed_kernel
two = os.path.join(here, "testdata", "ncu_two_steps.csv")
r = subprocess.run([sys.executable, tool, two, "--step", "2"], capture_output=True, text=True)
out = r.stdout.splitlines()
check(r.returncode == 0 and out and out[0] == "4 kernels, 296.5 us in all",
      f"second step: {out[:1]} {r.stderr}")
check(any("moe_gemm_kernel<32, 1, 1, 1, 3, 1>" in l for l in out)
      and not any("moe_gemm_kernel<32, 0," in l for l in out), "only the second step's kernels")
r = subprocess.run([sys.executable, tool, two, "--step", "1"], capture_output=True, text=True)
check(r.stdout.splitlines()[:1] == ["3 kernels, 232.0 us in all"], f"first step: {r.stdout[:40]}")
r = subprocess.run([sys.executable, tool, two, "--step", "3"], capture_output=True, text=True)
check(r.returncode != 0 and "holds 2 profiled step(s)" in r.stderr, "a step past the last is an error")
r = run_on_text(tool, "no profiler output here\n")
check(r.returncode != 0 and "no profiled kernels" in r.stderr, "a file without rows is an error")
finish("test_kernel_times")
