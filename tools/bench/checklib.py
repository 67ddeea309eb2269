"""checklib.py - the pass/fail bookkeeping the Python tests of tools/bench share: check() records
a condition that does not hold and prints what was expected; finish() prints the count and exits
non-zero when anything failed. The tests import it from their own directory."""
import sys

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print(f"FAIL: {what}", file=sys.stderr)


def finish(name):
    print(f"{name}: {len(failures)} failure(s)")
    sys.exit(1 if failures else 0)
