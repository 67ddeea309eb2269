#!/usr/bin/env bash
# test_runners.sh - the GPU machine's runners on stand-ins, without a GPU: run-packed.sh's verdicts
# (pass, skip, fail, expected failure) and their summary; and that run-packed.sh and
# run-variants.sh, stopped by a signal (an outer timeout), stop the tests or the benchmark they
# were running, which would otherwise go on holding the GPU. Exits 0 when every check holds.
set -u
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
cleanup() {
    for f in "$tmp"/pid.*; do [ -f "$f" ] && kill -KILL "$(cat "$f")" 2> /dev/null; done
    rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "test_runners: $*" >&2; exit 1; }
pack() { # ARCHIVE, the manifest on stdin (name, timeout, expected to fail, parallel, command)
    mkdir -p "$tmp/src" && cat > "$tmp/src/manifest.tsv" && tar cf "$1" -C "$tmp/src" manifest.tsv
}
run() { OUT=$tmp/out RW_PACK_DIR=$tmp/run "$here/run-packed.sh" "$@"; }
started() { local f; for f in "$@"; do [ -s "$f" ] || return 1; done; }
# RUNNER WHAT PIDFILE...: once every stand-in has written its pid, RUNNER (a timeout around a
# runner) is signalled as an expiring one signals its group; every stand-in must stop with it
stop_started() {
    local runner=$1 what=$2 f
    shift 2
    for _ in $(seq 600); do
        started "$@" && break
        sleep 0.1
    done
    started "$@" || fail "the stand-in $what did not start in 60 s"
    kill -TERM "$runner"
    wait "$runner"
    sleep 1
    for f in "$@"; do
        kill -0 "$(cat "$f")" 2> /dev/null &&
            fail "the stand-in $what $(basename "$f") still runs after its runner stopped"
    done
}

# verdicts: one of each, two at a time, one alone
printf '%s\t30\t0\t1\t["true"]\n%s\t30\t0\t1\t["sh","-c","exit 77"]\n%s\t30\t0\t0\t["false"]\n%s\t30\t1\t1\t["false"]\n' \
    passes skips fails xfails | pack "$tmp/a.tar"
run "$tmp/a.tar" --jobs 2 > "$tmp/a.log" 2>&1 && fail "a failing test left the exit status 0"
grep -q '4 tests: 1 ok, 1 skipped, 1 expected failures, 1 failed' "$tmp/out/suite.txt" ||
    fail "summary: $(tail -1 "$tmp/out/suite.txt")"
grep -q '^=== fails' "$tmp/out/failed.log" || fail "failed.log does not hold the failing test"
run "$tmp/a.tar" --only 'passes|skips' > "$tmp/b.log" 2>&1 || fail "--only passes|skips failed"

# a packed program that links a library the loader cannot find: named up front, and
# --unpack-only (whose caller runs the programs next) fails
if command -v cc > /dev/null; then
    mkdir -p "$tmp/g"
    echo 'int rw_ghost(void) { return 0; }' | cc -shared -fPIC -x c -o "$tmp/g/librwghost.so" - &&
        echo 'int rw_ghost(void); int main(void) { return rw_ghost(); }' |
        cc -x c -o "$tmp/g/prog" - -L"$tmp/g" -lrwghost || fail "cannot build the stand-in program"
    rm "$tmp/g/librwghost.so"
    printf 'ghost\t30\t0\t1\t["@B@/prog"]\n' > "$tmp/g/manifest.tsv"
    tar cf "$tmp/g.tar" -C "$tmp/g" manifest.tsv prog
    run "$tmp/g.tar" --unpack-only > "$tmp/g.log" 2>&1
    [ $? = 2 ] || fail "a program with a missing library left --unpack-only's status 0"
    grep -q 'need librwghost.so' "$tmp/g.log" || fail "the missing library is not named: $(cat "$tmp/g.log")"
    run "$tmp/g.tar" > "$tmp/g2.log" 2>&1 && fail "the test whose program cannot load passed"
    grep -q 'need librwghost.so' "$tmp/g2.log" || fail "the suite run does not name the library"
else
    echo "test_runners: no C compiler; the missing-library check is not run" >&2
fi

# stopped from outside: the two stand-in tests (each writes its pid, then sleeps) stop with it
printf '%s\t60\t0\t1\t["sh","-c","echo $$ > %s/pid.1; exec sleep 300"]\n%s\t60\t0\t1\t["sh","-c","echo $$ > %s/pid.2; exec sleep 300"]\n' \
    one "$tmp" two "$tmp" | pack "$tmp/c.tar"
OUT=$tmp/out RW_PACK_DIR=$tmp/run timeout 120 "$here/run-packed.sh" "$tmp/c.tar" --jobs 2 \
    > "$tmp/c.log" 2>&1 &
stop_started $! tests "$tmp/pid.1" "$tmp/pid.2"
grep -q 'stopped' "$tmp/c.log" || fail "the runner did not stop its tests: $(cat "$tmp/c.log")"
# run-variants.sh: a variant that hangs is stopped by its own limit, and by an outer timeout
mkdir -p "$tmp/v"
printf '#!/bin/sh\necho $$ > %s/pid.v\nexec sleep 300\n' "$tmp" > "$tmp/v/rw-hang"
chmod +x "$tmp/v/rw-hang"
printf 'hang\t-\n' > "$tmp/v/variants.txt"
tar cf - -C "$tmp/v" rw-hang variants.txt | xz > "$tmp/v.txz" # as pack-variants.sh writes it
OUT=$tmp/out RW_VARIANT_TIMEOUT=1 "$here/run-variants.sh" --rounds 1 --archive "$tmp/v.txz" hang \
    -- x > "$tmp/v1.log" 2>&1
grep -q 'hang round 1: timeout after 1s' "$tmp/v1.log" || fail "run-variants: $(cat "$tmp/v1.log")"
rm -f "$tmp/pid.v"
OUT=$tmp/out timeout 120 "$here/run-variants.sh" --rounds 1 --archive "$tmp/v.txz" hang -- x \
    > "$tmp/v2.log" 2>&1 &
stop_started $! benchmark "$tmp/pid.v"
echo "test_runners: ok"
