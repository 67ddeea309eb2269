"""checklib.py - the pass/fail bookkeeping the Python tests of tools/bench share: check() records
a condition that does not hold and prints what was expected; finish() prints the count and exits
non-zero when anything failed; run_on_text() runs a tool on a file holding the given text. The
tests import it from their own directory (tools/gpu/test_cubin_kernels.py from this one)."""
import os
import subprocess
import sys
import tempfile

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print(f"FAIL: {what}", file=sys.stderr)


def finish(name):
    print(f"{name}: {len(failures)} failure(s)")
    sys.exit(1 if failures else 0)


def run_on_text(tool, text, suffix=".csv", args=()):
    """The tool (a Python script) run on a temporary file holding text, then args: its
    CompletedProcess."""
    with tempfile.NamedTemporaryFile("w", suffix=suffix, delete=False) as f:
        f.write(text)
    try:
        return subprocess.run([sys.executable, tool, f.name, *args], capture_output=True,
                              text=True)
    finally:
        os.unlink(f.name)
