#!/usr/bin/env bash
# Session 28, last call: on an H200 only, run17 (G1L's b32 / b64 / b128 x 4k before and after
# the 64-token tile rule); on an 80 GB GPU nothing (b64 and b128 x 4k do not fit it).
R=${OUT:-out}
mkdir -p "$R"
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$R/r20_gpu.txt"
[ "${mem:-0}" -ge 100000 ] || { echo "run20: not an H200 ($mem MiB); nothing to do"; exit 0; }
RUN17_TAG=r20 BENCH_S=${BENCH_S:-280} bash .gpu-pack/run17.sh
