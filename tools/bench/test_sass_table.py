#!/usr/bin/env python3
"""test_sass_table.py - sass_table.py on a synthetic ncu SASS-page CSV (testdata/ncu_sass.csv,
numbers made up for the test): two kernels among other output, counts with thousands separators,
a predicated instruction, the opcode shares, the groups of equally executed lines (their shares of
the instructions and of the stall samples), the lines with the most stall samples, --kernel, and
clear errors on a file without rows or a kernel it does not hold."""
import os
import subprocess
import sys
import tempfile

from checklib import check, finish

here = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
tool = os.path.join(here, "sass_table.py")
data = os.path.join(here, "testdata", "ncu_sass.csv")


def run(*args):
    return subprocess.run([sys.executable, tool, *args], capture_output=True, text=True)


r = run(data, "--kernel", "1", "--top", "2")
check(r.returncode == 0, f"exit status {r.returncode}: {r.stderr}")
out = r.stdout.splitlines()
check(out[:2] == ["void moe_gemm_kernel<(int)32, (int)1, (bool)1>(gemm_args)",
                  "  6,200 instructions executed, 120 stall samples, 7 SASS lines"],
      f"title and totals: {out[:2]}")
ops = {l.split()[0]: l.split()[1:] for l in out if l.startswith("  ") and len(l.split()) == 3}
check(ops.get("HADD2") == ["32.3", "4.2"], f"HADD2: 2,000 of 6,200 instructions, 5 of 120 samples: {ops.get('HADD2')}")
check(ops.get("BRA") == ["16.1", "1.7"], f"the predicated BRA counts as BRA: {ops.get('BRA')}")
check(ops.get("WARPGROUP") == ["16.1", "50.0"], f"WARPGROUP: {ops.get('WARPGROUP')}")
i = out.index("  opcode        instr %   stall %")
check(out[i + 1].split()[0] == "HADD2", f"largest share first: {out[i + 1]}")
groups = [l.split() for l in out if l.startswith("  ") and l.split()[0].replace(",", "").isdigit()
          and len(l.split()) == 4]
check(groups[:2] == [["1,000", "4", "64.5", "93.3"], ["2,000", "1", "32.3", "4.2"]],
      "lines executed 1,000 times: 4, 64.5% of the instructions, 112 of 120 stall samples; "
      f"then the 2,000 group: {groups[:2]}")
check(out[-3] == "  most stall samples:", f"stall list heading: {out[-3:]}")
check("WARPGROUP.DEPBAR.LE" in out[-2] and out[-2].split()[1] == "60"
      and "LDS.128" in out[-1] and out[-1].split()[1] == "40", f"--top 2, most first: {out[-2:]}")
r = run(data)
check(r.returncode == 0 and r.stdout.count("instructions executed") == 2
      and "void gemm_kernel<(int)64, (int)64>(gemm_args)" in r.stdout
      and "  60 instructions executed, 8 stall samples, 2 SASS lines" in r.stdout,
      f"both kernels without --kernel: {r.stdout[-300:]}")
r = run(data, "--kernel", "3")
check(r.returncode != 0 and "holds 2 kernel(s)" in r.stderr, "a kernel past the last is an error")
with tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False) as f:
    f.write("no profiler output here\n")
r = run(f.name)
os.unlink(f.name)
check(r.returncode != 0 and "no SASS rows" in r.stderr, "a file without rows is an error")
finish("test_sass_table")
