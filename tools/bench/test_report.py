#!/usr/bin/env python3
"""test_report.py - checks tools/bench/report.py (and plots.sh when gnuplot is installed) on the
synthetic result files of tools/bench/testdata (made-up numbers, for this test only):
    test_report.py TOOLS_BENCH_DIR
"""
import os
import shutil
import subprocess
import sys
import tempfile

from checklib import check, finish

here = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
report = os.path.join(here, "report.py")
data = os.path.join(here, "testdata")


def run(*args):
    r = subprocess.run([sys.executable, report, *args], capture_output=True, text=True)
    check(r.returncode == 0, f"report.py {' '.join(args)} exited {r.returncode}: {r.stderr}")
    return r.stdout, r.stderr


with tempfile.TemporaryDirectory() as tmp:
    # 1. tables from a full synthetic run plus a rerun
    md, err = run(os.path.join(data, "synthetic.jsonl"), "--rerun", os.path.join(data, "rerun.jsonl"),
                  "--plots-dir", os.path.join(tmp, "plots"))
    rows = {l.split("|")[1].strip(): l for l in md.splitlines() if l.startswith("| S") or l.startswith("| G")}
    for t in ("S1", "S2", "S3", "S4", "S5", "G1", "G2", "G3", "G4", "G5"):
        check(t in rows, f"target row {t} present")
    check("not yet measured" in rows.get("S4", ""), "S4 without a line says not yet measured")
    check("failed: synthetic failure" in rows.get("S2", ""), "S2 error line shown as failed")
    check("| yes |" in rows.get("S1", ""), "S1 met")
    check("**no**" in rows.get("S3", ""), "S3 missed")
    check("20.0 x peer" in rows.get("G5", ""), "G5 ratio = rw / peer tok/s")
    check("1.36 x G1" in rows.get("G3", ""), "G3 compared with G1")
    check("1 of 2 medians" in md, "rerun spread summary")
    check("| G1 (forward) |" in md, "forward-level G1 shown beside G1")
    check("not JSON" in err, "a non-JSON line is reported and skipped")
    check("- **S3**" in md and "- **G4**" in md, "missed targets listed")
    for f in ("sync_vs_bucket.dat", "sync_vs_bucket.gp", "decode_vs_batch.dat", "decode_vs_batch.gp"):
        check(os.path.getsize(os.path.join(tmp, "plots", f)) > 0, f"plot file {f} written")
    dat = open(os.path.join(tmp, "plots", "decode_vs_batch.dat")).read()
    check("\n256 8533.3 " in dat, "decode data row for batch 256")

    # 1b. the G6/G7 table from the torch peer's compare lines (made-up numbers)
    md, _ = run(os.path.join(data, "synthetic.jsonl"), os.path.join(data, "kernels.jsonl"))
    krows = [l for l in md.splitlines() if l.startswith("| G6 |") or l.startswith("| G7 |")
             or l.startswith("| (info) |")]
    check("### Kernels against torch (G6, G7)" in md, "kernels section present")
    check(len(krows) == 3, f"three kernel rows ({len(krows)})")
    check(any("attention_decode_256x1024" in l and "0.500 x" in l and "**no**" in l and "cudnn" in l
              for l in krows), "G6 row: ratio, backend, missed")
    check(any(l.startswith("| G7 |") and "2.00 x" in l and "| yes |" in l for l in krows), "G7 row met")

    # 2. splicing keeps what is outside the markers
    doc = os.path.join(tmp, "BENCHMARKS.md")
    with open(doc, "w") as f:
        f.write("# head\n\n<!-- rw-bench report: begin -->\nOLD-CONTENT-XYZ\n<!-- rw-bench report: end -->\n\n## tail\n")
    run(os.path.join(data, "synthetic.jsonl"), "--md", doc)
    text = open(doc).read()
    check(text.startswith("# head\n") and text.rstrip().endswith("## tail"), "text outside markers kept")
    check("OLD-CONTENT-XYZ" not in text and "| S1 |" in text, "section replaced")

    # 3. no results at all
    empty = os.path.join(tmp, "empty.jsonl")
    open(empty, "w").close()
    md, _ = run(empty)
    check("Not yet measured" in md, "empty input says not yet measured")

    # 4. the PNGs, where gnuplot exists
    if shutil.which("gnuplot"):
        r = subprocess.run([os.path.join(here, "plots.sh"), os.path.join(tmp, "plots"), os.path.join(tmp, "png")],
                           capture_output=True, text=True)
        check(r.returncode == 0, f"plots.sh exited {r.returncode}: {r.stderr}")
        for f in ("sync_vs_bucket.png", "decode_vs_batch.png"):
            p = os.path.join(tmp, "png", f)
            check(os.path.exists(p) and os.path.getsize(p) > 1000, f"{f} rendered")
    else:
        print("note: gnuplot not installed; plots.sh not exercised", file=sys.stderr)

finish("test_report")
