#!/usr/bin/env bash
# test_runners.sh - the GPU machine's runners on stand-ins, without a GPU: run-packed.sh's verdicts
# (pass, skip, fail, expected failure) and their summary, and on merge-packs.sh's archives; that
# run-packed.sh and run-variants.sh, stopped by a signal (an outer timeout), stop the tests or
# the benchmark they were running, which would otherwise go on holding the GPU; and
# pack-variants.sh's DEFINE=VALUE variants on a stand-in tree; kernel-profile.sh's output folder
# on a stand-in ncu. Exits 0 when every check holds.
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

# merge-packs.sh: two archives as the variants of one; --variant runs one variant's tests, a
# name the archive lacks is refused naming those it has, and the merged archive without
# --variant is refused (no manifest at its root)
if command -v xz > /dev/null; then
    printf 'passes\t30\t0\t1\t["true"]\n' | pack "$tmp/m1.tar"
    printf 'fails\t30\t0\t1\t["false"]\n' | pack "$tmp/m2.tar"
    "$here/merge-packs.sh" "$tmp/m.txz" good=$tmp/m1.tar bad=$tmp/m2.tar > "$tmp/m.log" 2>&1 ||
        fail "merge-packs failed: $(cat "$tmp/m.log")"
    run "$tmp/m.txz" --variant good > "$tmp/m1.log" 2>&1 || fail "--variant good failed: $(cat "$tmp/m1.log")"
    grep -q '1 tests: 1 ok' "$tmp/out/suite.txt" || fail "--variant good: $(tail -1 "$tmp/out/suite.txt")"
    run "$tmp/m.txz" --variant bad > "$tmp/m2.log" 2>&1 && fail "--variant bad ran the passing test"
    grep -q '^=== fails' "$tmp/out/failed.log" || fail "--variant bad did not run its own test"
    run "$tmp/m.txz" --variant none > "$tmp/m3.log" 2>&1
    [ $? = 2 ] && grep -q 'no variant none (it has: good bad)' "$tmp/m3.log" ||
        fail "an absent variant: $(cat "$tmp/m3.log")"
    run "$tmp/m.txz" > "$tmp/m4.log" 2>&1
    [ $? = 2 ] && grep -q 'needs --variant' "$tmp/m4.log" || fail "no --variant: $(cat "$tmp/m4.log")"
    "$here/merge-packs.sh" "$tmp/m.txz" good=$tmp/m1.tar good=$tmp/m2.tar > "$tmp/m5.log" 2>&1
    [ $? = 2 ] && grep -q 'given twice' "$tmp/m5.log" || fail "a name given twice: $(cat "$tmp/m5.log")"
else
    echo "test_runners: no xz; the merge-packs check is not run" >&2
fi

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
# pack-variants.sh on a stand-in tree (its own git repository, a header of two values, a build
# that compiles a program printing them): a variant of one DEFINE=VALUE and one of two joined
# with a comma are each built with their values alone, the tree is as it was afterwards, and a
# DEFINE no file holds is refused with the tree left intact
if command -v cc > /dev/null && command -v ninja > /dev/null && command -v git > /dev/null &&
    command -v xz > /dev/null && command -v strip > /dev/null; then
    r=$tmp/repo
    mkdir -p "$r/tools/gpu" "$r/core" "$r/build" "$tmp/pv"
    cp "$here/pack-variants.sh" "$r/tools/gpu/"
    printf '#define RW_KNOB_A 1\n#define RW_KNOB_B 2\n' > "$r/core/knobs.h"
    printf '#include <stdio.h>\n#include "knobs.h"\nint main(void) { printf("%%d %%d\\n", RW_KNOB_A, RW_KNOB_B); return 0; }\n' \
        > "$r/prog.c"
    printf 'rule cc\n  command = cc -I%s/core -o $out %s/prog.c\nbuild tools/bench/rw-bench: cc %s/prog.c %s/core/knobs.h\n' \
        "$r" "$r" "$r" "$r" > "$r/build/build.ninja"
    (cd "$r" && git init -q && git add tools core prog.c &&
        git -c user.name=t -c user.email=t@t commit -qm t) || fail "cannot make the stand-in tree"
    (cd "$r" && bash tools/gpu/pack-variants.sh build base=- a=RW_KNOB_A=5 ab=RW_KNOB_A=7,RW_KNOB_B=9) \
        > "$tmp/pv.log" 2>&1 || fail "pack-variants failed: $(cat "$tmp/pv.log")"
    xz -dc "$r/.gpu-pack/variants.txz" | tar xf - -C "$tmp/pv" || fail "pack-variants' archive does not unpack"
    got="$("$tmp/pv/rw-base") / $("$tmp/pv/rw-a") / $("$tmp/pv/rw-ab")"
    [ "$got" = "1 2 / 5 2 / 7 9" ] || fail "pack-variants' builds print '$got', not '1 2 / 5 2 / 7 9'"
    (cd "$r" && git diff --quiet) || fail "pack-variants left the stand-in tree changed"
    (cd "$r" && bash tools/gpu/pack-variants.sh build bad=RW_KNOB_A=3,RW_NO_SUCH=1) > "$tmp/pv2.log" 2>&1
    st=$?
    [ $st = 2 ] || fail "a DEFINE no file holds left pack-variants' status $st: $(cat "$tmp/pv2.log")"
    grep -q "'#define RW_NO_SUCH' is in 0 files" "$tmp/pv2.log" || fail "the refusal: $(cat "$tmp/pv2.log")"
    (cd "$r" && git diff --quiet) || fail "a refused DEFINE left the stand-in tree changed"
else
    echo "test_runners: no cc, ninja, git, xz or strip; the pack-variants check is not run" >&2
fi
# kernel-profile.sh on a stand-in ncu (it writes the report it is asked for and prints a one-line
# SASS page): an OUT folder that does not exist yet, given relative to the caller's directory,
# receives the profile and the SASS table
kb=$tmp/kp
mkdir -p "$kb/bin" "$kb/build/tools/bench" "$kb/cwd"
printf '#!/bin/sh\nexit 0\n' > "$kb/build/tools/bench/rw-bench"
cat > "$kb/bin/ncu" << 'NCU'
#!/usr/bin/env bash
echo "$*" >> "${NCU_ARGS_LOG:-/dev/null}"
case " $* " in
*" -o "*) while [ $# -gt 0 ]; do [ "$1" = -o ] && out=$2; shift; done; : > "$out.ncu-rep" ;;
*"--page details"*) echo "Duration 1 us" ;;
*"--page source"*)
    printf '"Kernel Name","k"\n"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed"\n'
    printf '"0x10","IMAD R1, R2, R3, R4","5","100"\n' ;;
esac
NCU
chmod +x "$kb/bin/ncu" "$kb/build/tools/bench/rw-bench"
(cd "$kb/cwd" && PATH=$kb/bin:$PATH OUT=new/out RW_BUILD_DIR=$kb/build "$here/kernel-profile.sh" k) \
    > "$tmp/kp.log" 2>&1 || fail "kernel-profile on the stand-in ncu failed: $(cat "$tmp/kp.log")"
grep -q "IMAD" "$kb/cwd/new/out/profile_sass.txt" 2> /dev/null ||
    fail "kernel-profile did not write its table under the caller's OUT: $(cat "$tmp/kp.log")"
# --kernels: the kernel benches of an rw-bench named by RW_BENCH relative to the caller, the
# launches skipped as asked, the arguments passed as words
mkdir -p "$kb/cwd/v"
cp "$kb/build/tools/bench/rw-bench" "$kb/cwd/v/rw-x"
(cd "$kb/cwd" && PATH=$kb/bin:$PATH OUT=k NCU_ARGS_LOG=$kb/args RW_BENCH=v/rw-x \
    "$here/kernel-profile.sh" --kernels '--kernel-attention p8x2048 --warmup 0' --skip 2 --count 1 \
    atc_kernel) > "$tmp/kp2.log" 2>&1 || fail "kernel-profile --kernels failed: $(cat "$tmp/kp2.log")"
grep -q -- "--launch-skip 2 --launch-count 1 .* $kb/cwd/v/rw-x kernels --kernel-attention p8x2048 --warmup 0" \
    "$kb/args" || fail "kernel-profile --kernels ran ncu as: $(cat "$kb/args")"
grep -q "IMAD" "$kb/cwd/k/profile_sass.txt" 2> /dev/null ||
    fail "kernel-profile --kernels wrote no table: $(cat "$tmp/kp2.log")"
(cd "$kb/cwd" && PATH=$kb/bin:$PATH "$here/kernel-profile.sh" --kernels x --skip two k) \
    > "$tmp/kp3.log" 2>&1 && fail "kernel-profile took --skip two"
grep -q "count of launches" "$tmp/kp3.log" || fail "the --skip refusal: $(cat "$tmp/kp3.log")"
echo "test_runners: ok"
