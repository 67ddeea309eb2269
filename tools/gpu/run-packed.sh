#!/usr/bin/env bash
# run-packed.sh - runs the gpu-suite tests of an archive made by pack-tests.sh, on the GPU machine,
# from the checkout's root (their fixtures are read there) and without building anything:
#
#   tools/gpu/run-packed.sh [ARCHIVE] [--variant NAME] [--only REGEX] [--jobs N] [--all-logs]
#                           [--unpack-only]             default .gpu-pack/tests.txz
#
# The archive is unpacked under $RW_PACK_DIR (default /tmp/rw-packed), which becomes the tests'
# RW_BUILD_ROOT; RW_SOURCE_ROOT is the checkout. --variant NAME takes the variant NAME of an archive
# made by merge-packs.sh (several test archives in one). --only keeps the tests whose name matches
# REGEX (grep -E); --jobs N runs N at a time (default 1: several share one GPU, which the
# timing-free tests tolerate), except that a test meson may not run beside others (is_parallel:
# false, such as the one that fills the device's memory) runs alone, as meson test runs it. A test
# passes with exit status 0, is skipped with 77, and fails otherwise, except that a test meson
# expects to fail passes by failing (the hd128 end-to-end check, tests/worker/meson.build). The
# summary ends with the counts; the exit status is 1 when any test failed or passed unexpectedly. A
# signal that stops the runner (an outer timeout, ^C) stops the tests it is running too (exit status
# 143; tools/gpu/test_runners.sh checks it without a GPU).
# What stays in $OUT (./out without OUT) is few files, since the device tool returns at most 8:
# suite.txt (the summary) and, when a test failed, timed out or passed unexpectedly, failed.log
# (those tests' output, one after the other). --all-logs also keeps every test's output as
# $OUT/tests/NAME.log. The logs are under $RW_PACK_DIR/logs until the next unpack either way.
# --unpack-only stops after unpacking: the packed rw-bench is then
# $RW_PACK_DIR/tools/bench/rw-bench, for benchmarks in the same call.
# Before any test, every packed program's libraries are looked up: one the loader cannot find
# (.deps staged from a shorter package list) is named; with --unpack-only the exit status is
# then 2, otherwise the tests run (those whose programs cannot load fail).
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
ARCHIVE=.gpu-pack/tests.txz ONLY="" JOBS=1 UNPACK_ONLY=0 ALL_LOGS=0 VARIANT=
while [ $# -gt 0 ]; do
    case "$1" in
    --only) shift; ONLY=$1 ;;
    --variant) shift; VARIANT=$1 ;;
    --jobs) shift; JOBS=$1 ;;
    --unpack-only) UNPACK_ONLY=1 ;;
    --all-logs) ALL_LOGS=1 ;;
    -*) echo "run-packed: unknown option $1 (see the top of $0)" >&2; exit 2 ;;
    *) ARCHIVE=$1 ;;
    esac
    shift
done
[ -f "$ARCHIVE" ] || { echo "run-packed: no archive $ARCHIVE (tools/gpu/pack-tests.sh makes one)" >&2; exit 2; }
[ -f .deps/env.sh ] && source .deps/env.sh
[ -d /usr/local/cuda/bin ] && export PATH="/usr/local/cuda/bin:$PATH"
export NCCL_NVLS_ENABLE=0 RW_LOG=${RW_LOG:-warn} RW_SOURCE_ROOT=$root
pack=${RW_PACK_DIR:-/tmp/rw-packed}
case "$pack" in /*/*) ;; *) echo "run-packed: RW_PACK_DIR must be a directory below / (it is emptied): $pack" >&2; exit 2 ;; esac
case "$VARIANT" in *[!A-Za-z0-9_-]*) echo "run-packed: bad variant name '$VARIANT'" >&2; exit 2 ;; esac
rm -rf "$pack" && mkdir -p "$pack" || { echo "run-packed: cannot make $pack" >&2; exit 2; }
if [ -n "$VARIANT" ]; then
    tar xf "$ARCHIVE" -C "$pack" --strip-components=1 "$VARIANT" 2> /dev/null || {
        echo "run-packed: $ARCHIVE holds no variant $VARIANT (it has:" \
            "$(tar tf "$ARCHIVE" | sed -n 's,^\([^/]*\)/manifest.tsv$,\1,p' | paste -sd ' '))" >&2
        exit 2
    }
else
    tar xf "$ARCHIVE" -C "$pack" || { echo "run-packed: cannot unpack $ARCHIVE" >&2; exit 2; }
fi
[ -f "$pack/manifest.tsv" ] || { echo "run-packed: $ARCHIVE${VARIANT:+ (variant $VARIANT)} has no manifest.tsv: a merged archive needs --variant" >&2; exit 2; }
export RW_BUILD_ROOT=$pack
# A library the programs link that the loader cannot find here (.deps staged from an older or
# shorter package list) fails every test and benchmark the same way; say so once, up front.
missing=$(find "$pack" -type f -perm -u+x -exec ldd {} \; 2> /dev/null | sed -n 's/^[[:space:]]*\(\S*\) => not found.*/\1/p' | sort -u)
if [ -n "$missing" ]; then
    echo "run-packed: the packed programs need $(echo $missing) but the loader finds none here:" \
        "stage .deps again with tools/gpu/stage-deps.sh and source .deps/env.sh" >&2
    [ "$UNPACK_ONLY" = 1 ] && exit 2 # the caller is about to run them
fi
[ "$UNPACK_ONLY" = 1 ] && { echo "run-packed: unpacked in $pack"; exit 0; }
OUT=${OUT:-$root/out}
logs=$pack/logs
mkdir -p "$OUT" "$logs"
results=$(mktemp)
# Each test's timeout leads a process group of its own, so a signal that stops this script (an
# outer timeout, ^C) would leave the tests running, holding the GPU's memory for what comes
# next in the same call: the groups are recorded and stopped with it.
pids=$pack/pids
: > "$pids"
stop() {
    trap '' TERM INT # a timeout signals its child and then its group: the second must not end this
    local p
    while read -r p; do kill -TERM -- "-$p" 2> /dev/null; done < "$pids"
    sleep 2
    while read -r p; do kill -KILL -- "-$p" 2> /dev/null; done < "$pids"
    echo "run-packed: stopped; the running tests were stopped with it" >&2
    exit 143
}
trap stop TERM INT
one() { # NAME TIMEOUT EXPECT_FAIL CMD_JSON
    local name=$1 limit=$2 xfail=$3 cmdjson=$4 t0 rc st
    local -a cmd
    mapfile -t cmd < <(python3 -c 'import json, sys
for a in json.loads(sys.argv[1]):
    print(a.replace("@B@", sys.argv[2]).replace("@S@", sys.argv[3]))' "$cmdjson" "$pack" "$root")
    t0=$(date +%s)
    # the pid is recorded before timeout takes it over (exec), so no running test is missing
    # from the record; timeout then makes it the id of the test's process group
    (
        echo "$BASHPID" >> "$pids"
        exec timeout --kill-after=10 "$limit" "${cmd[@]}" > "$logs/$name.log" 2>&1
    ) &
    wait $!
    rc=$?
    case "$rc:$xfail" in
    0:0) st=OK ;;
    77:*) st=SKIP ;;
    0:1) st="UNEXPECTED PASS" ;;
    124:* | 137:*) st="TIMEOUT after ${limit}s" ;;
    *:1) st="EXPECTED FAIL" ;;
    *) st="FAIL (exit $rc)" ;;
    esac
    printf '%-42s %-22s %5ss\n' "$name" "$st" "$(($(date +%s) - t0))" | tee -a "$results"
}
running=0
while IFS=$'\t' read -r name limit xfail par cmdjson; do
    [ -n "$ONLY" ] && ! echo "$name" | grep -Eq -- "$ONLY" && continue
    if [ "$par" = 0 ]; then
        wait
        running=0
        one "$name" "$limit" "$xfail" "$cmdjson"
        continue
    fi
    one "$name" "$limit" "$xfail" "$cmdjson" &
    running=$((running + 1))
    if [ "$running" -ge "$JOBS" ]; then
        wait -n
        running=$((running - 1))
    fi
done < "$pack/manifest.tsv"
wait
n=$(wc -l < "$results")
failed=' (FAIL \(|TIMEOUT|UNEXPECTED PASS)' # the results that fail the run
bad=$(grep -cE "$failed" "$results")
summary="run-packed: $n tests: $(grep -c ' OK ' "$results") ok, $(grep -c ' SKIP ' "$results") skipped, $(grep -c 'EXPECTED FAIL' "$results") expected failures, $bad failed"
echo "$summary"
{ cat "$results"; echo "$summary"; } > "$OUT/suite.txt"
rm -f "$OUT/failed.log"
grep -E "$failed" "$results" | while read -r name _; do
    { echo "=== $name"; cat "$logs/$name.log"; echo; } >> "$OUT/failed.log"
done
if [ "$ALL_LOGS" = 1 ]; then
    mkdir -p "$OUT/tests" && cp "$logs"/*.log "$OUT/tests/"
fi
rm -f "$results"
[ "$bad" -eq 0 ]
