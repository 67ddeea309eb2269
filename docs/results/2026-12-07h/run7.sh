#!/usr/bin/env bash
# Prepared in the forty-ninth session for the next session's first call (main 8a181c9; the
# kernels are 02eab3c's). On an H200 the target rows G1 / G2 / G3 first (not measured on that
# card since the thirtieth session; ../2026-12-07g/run4.sh's command), then run6.sh (the w13
# tile's diagnostics and s2); on an H100 run6.sh, then ../2026-12-07g/run7.sh (th32 / th96) as
# time allows.
# Archives: tools/gpu/pack-variants.sh BUILD main=- s2=s2.patch b256p=b256p.patch
#   dbar=dbar.patch mmaonly=mmaonly.patch nosync=nosync.patch mmans=mmans.patch
#   hionly=hionly.patch th32=../2026-12-07g/th32.patch th96=../2026-12-07g/th96.patch;
#   tests_s2.txz, tests_b256p.txz and tests_dbar.txz with each patch applied (pack-tests.sh).
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
s0=$SECONDS
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
if [ "${mem:-0}" -ge 100000 ]; then
    mkdir -p /tmp/rw-g && tar xf .gpu-pack/variants.txz -C /tmp/rw-g
    timeout 200 /tmp/rw-g/rw-main $C decode --batches 1,256 --ctxs 1024 --steps 10 --gen 1,16,2 \
        --gen-reps 1 > "$R/u_g123.jsonl" 2> "$R/u_g123.err"
    echo "rw-bench exit $?"
    python3 tools/bench/report.py "$R/u_g123.jsonl" 2>/dev/null | grep -E '^\| G[123] '
    tail -2 "$R/u_g123.err"
    echo "target rows done at $((SECONDS - s0)) s"
fi
bash docs/results/2026-12-07h/run6.sh
[ $((570 - (SECONDS - s0))) -ge 150 ] && bash docs/results/2026-12-07g/run7.sh
echo "call took $((SECONDS - s0)) s"
