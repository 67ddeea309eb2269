#!/usr/bin/env bash
# Installs the Debian packages rw builds against (skips what is already there). The CUDA toolkit
# (nvcc, cuBLASLt, NCCL under /usr/local/cuda) is optional: without it rw builds the CPU backend.
set -euo pipefail
pkgs=(meson ninja-build pkg-config gcc libc6-dev
      libzmq3-dev libmsgpack-dev libjansson-dev libxxhash-dev libcmocka-dev)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
    echo "install-deps: all packages present"
    exit 0
fi
echo "install-deps: installing ${missing[*]}"
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
