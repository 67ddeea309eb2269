#!/usr/bin/env bash
# Renders the plots of docs/BENCHMARKS.md with gnuplot from the data and scripts report.py wrote:
#   tools/bench/plots.sh [PLOTS_DIR [PNG_DIR]]     (defaults: docs/plots and docs)
# makes PNG_DIR/sync_vs_bucket.png and PNG_DIR/decode_vs_batch.png (pngcairo, or png when gnuplot
# has no cairo terminal; Debian's gnuplot-nox has both).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
plots=${1:-$root/docs/plots}
pngs=${2:-$root/docs}
command -v gnuplot >/dev/null || { echo "plots.sh: gnuplot not found (apt-get install gnuplot-nox)" >&2; exit 1; }
[ -d "$plots" ] || { echo "plots.sh: no $plots (run tools/bench/report.py --plots-dir first)" >&2; exit 1; }
mkdir -p "$pngs"
pngs=$(cd "$pngs" && pwd)
status=0
for gp in sync_vs_bucket.gp decode_vs_batch.gp; do
    if [ ! -f "$plots/$gp" ]; then
        echo "plots.sh: $plots/$gp missing" >&2
        status=1
        continue
    fi
    (cd "$plots" && gnuplot -e "outdir='$pngs'" "$gp") || status=1
    png="$pngs/${gp%.gp}.png"
    if [ -s "$png" ]; then
        echo "plots.sh: wrote $png"
    else
        echo "plots.sh: $png not written" >&2
        status=1
    fi
done
exit $status
