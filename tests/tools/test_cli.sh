#!/usr/bin/env bash
# test_cli.sh - what a first-time user meets on the command line: every program answers
# --version ("<name> <version>", exit 0) and --help (usage on stdout, exit 0); rw-ctl defaults --to
# to the worker's default address and, when nothing listens where it is pointed, says so within
# seconds (exit 3) instead of waiting for its reply timeout; rw-worker refuses to serve HTTP on a
# non-loopback address without a token (exit 2).
set -uo pipefail
build=${RW_BUILD_ROOT:?}
passes=0 fails=0
ok() { echo "ok   $1"; passes=$((passes + 1)); }
bad() { echo "FAIL $1"; fails=$((fails + 1)); }
for p in worker/rw-worker tools/ctl/rw-ctl tools/trainer/rw-trainer tools/ckpt/rw-ckpt \
         tools/layout/rw-layout tools/bench/rw-bench; do
    exe=$build/$p
    [ -x "$exe" ] || { echo "skip: $exe is not built"; continue; }
    name=$(basename "$p")
    v=$("$exe" --version 2>&1) && [[ $v =~ ^$name\ [0-9]+\.[0-9]+\.[0-9]+$ ]] && ok "$name --version: $v" ||
        bad "$name --version: '$v'"
    h=$("$exe" --help 2>/dev/null) && grep -qi usage <<<"$h" && ok "$name --help: exit 0, usage on stdout" ||
        bad "$name --help"
done
ctl=$build/tools/ctl/rw-ctl
# a port nothing listens on: bind one, close it
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
t0=$(date +%s%N)
out=$("$ctl" --to "tcp://127.0.0.1:$port" health 2>&1)
rc=$?
ms=$((($(date +%s%N) - t0) / 1000000))
[ $rc -eq 3 ] && grep -q "nothing listens at tcp://127.0.0.1:$port" <<<"$out" && [ $ms -lt 5000 ] &&
    ok "rw-ctl against nothing: exit 3 in $ms ms: $out" || bad "rw-ctl against nothing: rc $rc, $ms ms: $out"
out=$("$ctl" --to ipc:///nonexistent/rw.sock stats 2>&1)
[ $? -eq 3 ] && grep -q "nothing listens at ipc:///nonexistent/rw.sock" <<<"$out" && ok "rw-ctl ipc: $out" ||
    bad "rw-ctl ipc: $out"
if ! python3 -c 'import socket; socket.create_connection(("127.0.0.1", 5557), 1)' 2>/dev/null; then
    out=$("$ctl" health 2>&1)
    [ $? -eq 3 ] && grep -q "tcp://127.0.0.1:5557" <<<"$out" && ok "rw-ctl without --to: the default address" ||
        bad "rw-ctl default address: $out"
fi
"$ctl" --to 2>/dev/null; [ $? -eq 2 ] && ok "rw-ctl --to without a value: usage error" || bad "rw-ctl --to"
out=$("$build/worker/rw-worker" --config /dev/null --http 0.0.0.0:0 2>&1)
[ $? -eq 2 ] && grep -q "refusing to serve HTTP on '0.0.0.0:0' without authentication" <<<"$out" &&
    ok "rw-worker --http 0.0.0.0 without a token: refused" || bad "rw-worker --http 0.0.0.0: $out"
echo "$passes passed, $fails failed"
[ $fails -eq 0 ]
