#!/usr/bin/env bash
# Forty-second session, call 2. run1 (c1_*): main's tests passed; the inflight tree failed
# moe_experts_gpu's fp8-block case (an illegal address): its K loop took every two-warpgroup
# register-fragment tile, the 128-token fp8-block tiles included, and converted them as mxfp8.
# inflight2.patch keeps it to mxfp8. In order:
#   1. the GPU tests of the inflight2 tree (tests_inflight2.txz)
#   2. in turns, three rounds: main (36e736f), inflight (inflight2.patch), inflight6 (the same at
#      six stages: MOE_MX_WG_STAGES 6); mxfp8-last-8 b256 x 1k with bf16 beside it (x 512 on an
#      H100; on an H200 b1,256 x 1k: the G1 / G2 / G3 rows), inflight dropped if its tests fail
#   3. with the time left, Nsight Compute of the mxfp8 w13 tile of inflight (else main)
# Prepare:
#   tools/gpu/pack-tests.sh BUILD .gpu-pack/tests_inflight2.txz   (tree + inflight2.patch)
#   tools/gpu/pack-variants.sh BUILD main=- inflight=$(pwd)/docs/results/2026-12-07/inflight2.patch \
#     inflight6=$(pwd)/docs/results/2026-12-07/inflight6.patch
# Carry .deps and .gpu-pack; RW_CALL_BUDGET (seconds, default 480) bounds the script.
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$R/n_gpu.txt"
s0=$SECONDS
B=${RW_CALL_BUDGET:-480}
timeout 150 tools/gpu/run-packed.sh .gpu-pack/tests_inflight2.txz \
    --only "moe_experts_gpu|worker_invariance_gpu|worker_cuda_vs_transformers_gpu" > "$R/n_tests.txt" 2>&1
rc=$?
tail -5 "$R/n_tests.txt"; grep -h "quantized weights" /tmp/rw-packed/logs/*.log 2>/dev/null | sort -u
[ -f "$R/failed.log" ] && { tail -c 3000 "$R/failed.log"; echo "tests failed"; }
echo "tests (exit $rc) done at $((SECONDS - s0)) s"
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
if [ "${mem:-0}" -ge 100000 ]; then P="--batches 1,256 --ctxs 1024"; else P="--batches 256 --ctxs 512"; fi
V="main inflight inflight6"
[ $rc -ne 0 ] && V="main"
VT=$((B - (SECONDS - s0) - 90)); [ $VT -gt 360 ] && VT=360
OUT=$R/v RW_VARIANT_TIMEOUT=100 timeout $VT tools/gpu/run-variants.sh --rounds 3 $V -- $C \
    decode $P --steps 10 --gen 1,16,2 --gen-reps 1 --no-forward
python3 tools/bench/variant_lines.py "$R/v/variants.txt" --what "decode_bf16|decode_mxfp8"
mv "$R/v/variants.txt" "$R/n_variants.txt"; rm -rf "$R/v"
echo "variants done at $((SECONDS - s0)) s"
left=$((B - (SECONDS - s0)))
PV=inflight; [ $rc -ne 0 ] && PV=main
if [ $left -ge 80 ]; then
    mkdir -p /tmp/pb/tools/bench && cp /tmp/rw-variants/rw-$PV /tmp/pb/tools/bench/rw-bench
    OUT=$R/p RW_BUILD_DIR=/tmp/pb timeout $((left - 10)) tools/gpu/kernel-profile.sh --quant --count 1 \
        'moe_gemm_kernel<.int.32, .int.1, .bool.1, .bool.1' > "$R/n_profile_log.txt" 2>&1
    cp "$R/p/profile.txt" "$R/n_profile_$PV.txt" 2>/dev/null
    cp "$R/p/profile_sass.txt" "$R/n_profile_sass_$PV.txt" 2>/dev/null
    rm -rf "$R/p"
    grep -E "Duration|DRAM Throughput|Issue Slots Busy|Eligible Warps|Executed Instructions" "$R/n_profile_$PV.txt" | head
    tail -3 "$R/n_profile_log.txt"
fi
echo "all took $((SECONDS - s0)) s"
