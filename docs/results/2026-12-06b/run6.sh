#!/usr/bin/env bash
# Session 34, call 6 (an H200: b256 x 1k does not fit an H100). Planned first with run5.sh's
# fresh / early variants, which found no H200; as run: variants.txz of call 7 (base, nocomb,
# norope, noacomb). run4.sh's diagnosis first: b1 x 1k alone against b1 after b256 x 1k in one
# engine (main's rw-bench, two runs each in turns); then run7.sh's one-token bounds on the H200.
R=${OUT:-out}
mkdir -p /tmp/rw-variants && tar xJf .gpu-pack/variants.txz -C /tmp/rw-variants
mkdir -p "$R/diag"
OUT=$R/diag bash docs/results/2026-12-06b/run4.sh --diag-only
if grep -q nocomb /tmp/rw-variants/variants.txt; then # (the archive of call 7)
    mkdir -p "$R/bounds"
    OUT=$R/bounds bash docs/results/2026-12-06b/run7.sh
fi
