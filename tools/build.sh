#!/usr/bin/env bash
# Configures (once) and builds rw in ./build. The CUDA backend is built when nvcc is found
# (PATH or /usr/local/cuda/bin); set RW_CUDA=disabled to force the CPU-only build.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -d /usr/local/cuda/bin ] && export PATH="$PATH:/usr/local/cuda/bin"
dir=${RW_BUILD_DIR:-build}
if [ ! -f "$dir/build.ninja" ]; then
    meson setup "$dir" -Dcuda="${RW_CUDA:-auto}" ${RW_MESON_ARGS:-}
fi
ninja -C "$dir"
