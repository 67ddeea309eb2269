#!/usr/bin/env bash
# Session 34, call 6 (an H200: b256 x 1k does not fit an H100): run5.sh's variants (base, fresh,
# early) on the H200's shapes, then run4.sh's diagnosis of b1 x 1k alone against b1 after
# b256 x 1k in one engine (main's rw-bench, four runs in turns). One archive each.
bash docs/results/2026-12-06b/run5.sh
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
[ "$mem" -gt 100000 ] || exit 0
R=${OUT:-out}
mkdir -p "$R/diag"
OUT=$R/diag bash docs/results/2026-12-06b/run4.sh --diag-only
