#!/usr/bin/env bash
# Session 35, call 1: the previous session's two prepared runs in one call. run11.sh: the GEMV's
# slice sum with every remote partial loaded before the adds (gvred.patch) against main, its
# tests first; run12.sh: the timer stamps of main's ring, ring8 and ring8w. Archive:
# pack-variants base=- gvred=gvred.patch stamps=gvstamps.patch ring8=ring8_stamps.patch
# ring8w=ring8w_stamps.patch (all from docs/results/2026-12-06b), and pack-tests of branch
# gemv-reduce as tests_gvred.txz.
R=${OUT:-out}
bash docs/results/2026-12-06b/run11.sh
bash docs/results/2026-12-06b/run12.sh
ls -la "$R"
