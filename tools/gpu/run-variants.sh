#!/usr/bin/env bash
# run-variants.sh - on the GPU machine, the rw-bench variants of pack-variants.sh, in turns:
#
#   tools/gpu/run-variants.sh [--rounds N] [--archive FILE] NAME ... -- RW-BENCH ARGS
#
# Each round runs every named variant once, in the order given (A B C A B C ...), so that a
# machine's drift over the call falls on every variant alike; default 2 rounds. Every run's
# output goes, headed "=== NAME ROUND", into $OUT/variants.txt (./out without OUT): one file,
# since the device tool returns at most 8. A run that fails or passes its time limit
# (RW_VARIANT_TIMEOUT seconds, default 120) is marked in its header line and the rest go on.
# tools/bench/variant_lines.py prints the lines that compare them.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=2 ARCHIVE=.gpu-pack/variants.txz
names=()
while [ $# -gt 0 ]; do
    case "$1" in
    --rounds) shift; ROUNDS=$1 ;;
    --archive) shift; ARCHIVE=$1 ;;
    --) shift; break ;;
    -*) echo "run-variants: unknown option $1 (see the top of $0)" >&2; exit 2 ;;
    *) names+=("$1") ;;
    esac
    shift
done
[ ${#names[@]} -gt 0 ] && [ $# -gt 0 ] || { sed -n '2,11p' "$0" >&2; exit 2; }
[ -f "$ARCHIVE" ] || { echo "run-variants: no archive $ARCHIVE (tools/gpu/pack-variants.sh makes one)" >&2; exit 2; }
[ -f .deps/env.sh ] && source .deps/env.sh
export NCCL_NVLS_ENABLE=0
dir=/tmp/rw-variants
rm -rf "$dir" && mkdir -p "$dir" && tar xf "$ARCHIVE" -C "$dir" || { echo "run-variants: cannot unpack $ARCHIVE" >&2; exit 2; }
for n in "${names[@]}"; do
    [ -x "$dir/rw-$n" ] || { echo "run-variants: the archive has no variant $n ($(cut -f1 "$dir/variants.txt" | tr '\n' ' '))" >&2; exit 2; }
done
OUT=${OUT:-$(pwd)/out}
mkdir -p "$OUT"
log=$OUT/variants.txt
: > "$log"
limit=${RW_VARIANT_TIMEOUT:-120}
for r in $(seq 1 "$ROUNDS"); do
    for n in "${names[@]}"; do
        t0=$(date +%s)
        # --foreground: rw-bench stays in this script's process group, so whatever stops the
        # script (an outer timeout signals its group) stops the benchmark too
        timeout --foreground --kill-after=10 "$limit" "$dir/rw-$n" "$@" > "$dir/run.txt" 2>&1
        rc=$?
        spec=$(awk -F'\t' -v n="$n" '$1 == n { print $2 }' "$dir/variants.txt")
        st="ok"
        [ $rc -ne 0 ] && st="exit $rc"
        [ $rc -eq 124 ] || [ $rc -eq 137 ] && st="timeout after ${limit}s"
        { echo "=== $n $r ($spec; $st, $(($(date +%s) - t0)) s)"; cat "$dir/run.txt"; } >> "$log"
        echo "run-variants: $n round $r: $st"
    done
done
