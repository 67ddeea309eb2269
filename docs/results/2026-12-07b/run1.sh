#!/usr/bin/env bash
# The forty-second session's run5.sh, run in the forty-third session as its first call (any card).
# In order:
#   1. does the row-whole mxfp8 layout's access pattern itself cap the decode expert tile's
#      weight stream? tools/gpu/stream_probe (a GPU build's, copied to .gpu-pack) copies the w13
#      and w2 panels of Qwen3-30B-A3B's expert shapes the way the tile does, with no arithmetic:
#      rows64 pf0 / pf128 / pf256, rows128 pf256, and the same bytes read K-blocked, beside a
#      device-to-device copy in the same run; first at the split w13 tile's shared memory (91 KB
#      a CTA, two CTAs an SM, five stages), then four stages at 73 KB (three CTAs an SM)
#   2. the GPU tests of the narrow16 tree (tests_narrow16.txz: main + narrow16.patch, the
#      32-token register-fragment tiles on n16 MMAs where they hold 16 tokens or fewer)
#   3. on an H200, the target rows G1 / G2 / G3 (rw-main of variants.txz, as run4.sh)
#   4. main and narrow16 in turns, three rounds (dropped to main if its tests fail): mxfp8-last-8
#      b256 x 1k with bf16 beside it (x 512 on an H100; b1,256 x 1k on an H200)
# Prepare from main:
#   ninja -C BUILD && cp BUILD/tools/gpu/stream_probe .gpu-pack/
#   git apply docs/results/2026-12-07/narrow16.patch && touch moe/*.cu && ninja -C BUILD &&
#     tools/gpu/pack-tests.sh BUILD .gpu-pack/tests_narrow16.txz; git checkout moe/expert_gemm.cu
#   touch moe/*.cu && tools/gpu/pack-variants.sh BUILD main=- \
#     narrow16=$(pwd)/docs/results/2026-12-07/narrow16.patch
# Carry .deps and .gpu-pack; RW_CALL_BUDGET (seconds, default 480) bounds the script.
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$R/n_gpu.txt"
s0=$SECONDS
B=${RW_CALL_BUDGET:-480}
timeout 60 .gpu-pack/stream_probe > "$R/n_probe.jsonl" 2> "$R/n_probe.err"; echo "probe exit $?"
timeout 40 .gpu-pack/stream_probe --stages 4 --smem-kb 73 > "$R/n_probe_st4.jsonl" 2>> "$R/n_probe.err"
echo "probe st4 exit $?"; cat "$R/n_probe.err"
python3 -c "
import json,sys
for f in sys.argv[1:]:
    for l in open(f):
        o=json.loads(l)
        print(o['case'].ljust(14), o['M'], o['K'], 'st', o['stages'], 'cta/sm', o['ctas_per_sm'], o['median_ms'], 'ms', o['read_gbps'], 'GB/s', 'copy', o['copy_gbps'], 'ratio', o['ratio'], 'sum', o['sum_ok'])
" "$R/n_probe.jsonl" "$R/n_probe_st4.jsonl"
echo "probe done at $((SECONDS - s0)) s"
timeout 150 tools/gpu/run-packed.sh .gpu-pack/tests_narrow16.txz \
    --only "moe_experts_gpu|worker_invariance_gpu|worker_cuda_vs_transformers_gpu" > "$R/n_tests.txt" 2>&1
rc=$?
tail -5 "$R/n_tests.txt"; grep -h "quantized weights" /tmp/rw-packed/logs/*.log 2>/dev/null | sort -u
[ -f "$R/failed.log" ] && { tail -c 3000 "$R/failed.log"; echo "tests failed"; }
echo "tests (exit $rc) done at $((SECONDS - s0)) s"
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
if [ "${mem:-0}" -ge 100000 ]; then
    mkdir -p /tmp/rw-variants && tar xf .gpu-pack/variants.txz -C /tmp/rw-variants
    timeout 200 /tmp/rw-variants/rw-main $C decode --batches 1,256 --ctxs 1024 \
        --steps 10 --gen 1,16,2 --gen-reps 1 > "$R/n_g123.jsonl" 2> "$R/n_g123.err"
    echo "rw-bench exit $?"
    python3 tools/bench/report.py "$R/n_g123.jsonl" 2>/dev/null | grep -E '^\| G[123] '
    tail -3 "$R/n_g123.err"
    echo "target rows done at $((SECONDS - s0)) s"
    P="--batches 1,256 --ctxs 1024"
else
    P="--batches 256 --ctxs 512"
fi
V="main narrow16"
[ $rc -ne 0 ] && V="main"
VT=$((B - (SECONDS - s0) - 10)); [ $VT -gt 360 ] && VT=360
OUT=$R/v RW_VARIANT_TIMEOUT=100 timeout $VT tools/gpu/run-variants.sh --rounds 3 $V -- $C \
    decode $P --steps 10 --gen 1,16,2 --gen-reps 1 --no-forward
python3 tools/bench/variant_lines.py "$R/v/variants.txt" --what "decode_bf16|decode_mxfp8"
mv "$R/v/variants.txt" "$R/n_variants.txt"; rm -rf "$R/v"
echo "all took $((SECONDS - s0)) s"
