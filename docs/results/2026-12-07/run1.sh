#!/usr/bin/env bash
# First call of the forty-second session (next.sh of 2026-12-06i as prepared). In order:
#   1. the GPU tests of main (tests_main.txz: main at 7d9ba06, the 256-byte L2 fetch) and of the
#      inflight tree (tests_inflight.txz: main + inflight.patch, MOE_MX_INFLIGHT 1)
#   2. (H200) rw-bench decode --batches 1,256 --ctxs 1024 from main's rw-bench: G1, G2 and G3
#      (mxfp8-last-8 against bf16, both at b256 x 1k; they do not fit 80 GB)
#   3. the builds of variants.txz in turns, two or three rounds as the budget allows,
#      mxfp8-last-8 b256 x 1k with bf16 b256 x 512 beside it:
#        main      MOE_QUANT_L2_PF 256
#        a512      + one bulk L2 prefetch a row every four blocks, 256 bytes, 512 bytes ahead
#        st4       the two-warpgroup mxfp8 tiles at four stages (five in main): room for three
#                  CTAs an SM
#        a512st4   both
#        inflight  inflight.patch: those tiles keep a block's MMAs in flight while the warp
#                  converts the next block's fragments into a second set (dropped from the
#                  timing if its tests fail: a wrong tile routes garbage and times nothing)
# Prepare from main (the tree as it is, with the knobs of moe/expert_gemm.cu):
#   tools/gpu/pack-tests.sh BUILD .gpu-pack/tests_main.txz
#   git apply docs/results/2026-12-06i/inflight.patch && touch moe/*.cu && ninja -C BUILD &&
#     tools/gpu/pack-tests.sh BUILD .gpu-pack/tests_inflight.txz; git checkout moe/expert_gemm.cu
#   tools/gpu/pack-variants.sh BUILD main=- a512=MOE_QUANT_L2_AHEAD=512 st4=MOE_MX_WG_STAGES=4 \
#     a512st4=MOE_QUANT_L2_AHEAD=512,MOE_MX_WG_STAGES=4 \
#     inflight=$(pwd)/docs/results/2026-12-06i/inflight.patch
# Carry .deps and .gpu-pack; RW_CALL_BUDGET (seconds, default 480) bounds the script.
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$R/n_gpu.txt"
s0=$SECONDS
B=${RW_CALL_BUDGET:-480}
T="moe_experts_gpu|worker_invariance_gpu|worker_cuda_vs_transformers_gpu"
OUT=$R/ti RW_PACK_DIR=/tmp/rw-packed-inflight timeout 120 tools/gpu/run-packed.sh \
    .gpu-pack/tests_inflight.txz --only "$T" > "$R/n_tests_inflight.txt" 2>&1
rci=$?
tail -4 "$R/n_tests_inflight.txt"
grep -h "quantized weights" /tmp/rw-packed-inflight/logs/*.log 2>/dev/null | sort -u
[ -f "$R/ti/failed.log" ] && { tail -c 2000 "$R/ti/failed.log"; cp "$R/ti/failed.log" "$R/n_failed_inflight.log"; }
rm -rf "$R/ti"
timeout 150 tools/gpu/run-packed.sh .gpu-pack/tests_main.txz --only "$T" > "$R/n_tests.txt" 2>&1
rc=$?
tail -4 "$R/n_tests.txt"; grep -h "quantized weights" /tmp/rw-packed/logs/*.log 2>/dev/null | sort -u
[ -f "$R/failed.log" ] && { tail -c 2000 "$R/failed.log"; echo "main's tests failed"; }
echo "tests (main exit $rc, inflight exit $rci) done at $((SECONDS - s0)) s"
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
if [ "${mem:-0}" -ge 100000 ] && [ -x /tmp/rw-packed/tools/bench/rw-bench ]; then
    timeout 200 /tmp/rw-packed/tools/bench/rw-bench $C decode --batches 1,256 --ctxs 1024 --steps 10 \
        --gen 1,16,2 --gen-reps 1 > "$R/n_g123.jsonl" 2> "$R/n_g123.err"
    grep -h '"decode_bf16\|"decode_mxfp8\|decode_forward' "$R/n_g123.jsonl" | python3 -c "
import json,sys
for l in sys.stdin:
    o=json.loads(l)
    print(o['what'], o.get('batch'), o.get('ctx'), round(o.get('median_s',0)*1e3,3), 'ms', o.get('ratio'), o.get('hbm_gbps'), o.get('target_id'), o.get('met'))"
    tail -2 "$R/n_g123.err"
    echo "target rows done at $((SECONDS - s0)) s"
fi
VT=$((B - (SECONDS - s0) - 20)); [ $VT -gt 400 ] && VT=400
V=${RW_V:-main a512 st4 a512st4 inflight}
[ $rci -ne 0 ] && V=${V/ inflight/}
nv=$(echo $V | wc -w)
RN=3; [ $VT -lt $((nv * 16 * 3 + 20)) ] && RN=2 # a variant-round is about 16 s on an H100
OUT=$R/v RW_VARIANT_TIMEOUT=90 timeout $VT tools/gpu/run-variants.sh --rounds $RN $V -- $C \
    decode --batches 256 --ctxs 512 --steps 10 --gen 1,16,2 --gen-reps 1 --no-forward
python3 tools/bench/variant_lines.py "$R/v/variants.txt" --what "decode_bf16|decode_mxfp8"
mv "$R/v/variants.txt" "$R/n_variants.txt"; rm -rf "$R/v"
echo "all took $((SECONDS - s0)) s"
