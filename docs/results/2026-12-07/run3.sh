#!/usr/bin/env bash
# Forty-second session, call 3. run2 (c2_*): the inflight tree passed its tests but timed 1%
# slower than main (27.91-28.03 against 27.69-27.71 ms); its profile shows 94 registers, which
# leave room for two CTAs an SM where main's 71 leave three. In order:
#   1. the GPU tests of the occ4 tree (tests_occ4.txz: MOE_MX_WG_STAGES 4, MOE_MX_WG_MINB 4)
#   2. in turns, three rounds: main (MOE_MX_WG_MINB 1), occ4 (the two-warpgroup mxfp8 tiles at
#      four stages held to 64 registers: four CTAs an SM, 56 KB of shared memory each for w13),
#      inflight3 (inflight2 held to 80 registers: three CTAs an SM; 24 bytes of spills);
#      mxfp8-last-8 b256 x 1k with bf16 beside it (x 512 on an H100; on an H200 b1,256 x 1k)
#   3. with the time left, Nsight Compute of occ4's mxfp8 w13 tile
# Prepare:
#   (tree with the two knobs at 4) tools/gpu/pack-tests.sh BUILD .gpu-pack/tests_occ4.txz
#   tools/gpu/pack-variants.sh BUILD main=- occ4=MOE_MX_WG_STAGES=4,MOE_MX_WG_MINB=4 \
#     inflight3=$(pwd)/docs/results/2026-12-07/inflight3.patch
# Carry .deps and .gpu-pack; RW_CALL_BUDGET (seconds, default 480) bounds the script.
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$R/n_gpu.txt"
s0=$SECONDS
B=${RW_CALL_BUDGET:-480}
timeout 150 tools/gpu/run-packed.sh .gpu-pack/tests_occ4.txz \
    --only "moe_experts_gpu|worker_invariance_gpu|worker_cuda_vs_transformers_gpu" > "$R/n_tests.txt" 2>&1
rc=$?
tail -5 "$R/n_tests.txt"; grep -h "quantized weights" /tmp/rw-packed/logs/*.log 2>/dev/null | sort -u
[ -f "$R/failed.log" ] && { tail -c 3000 "$R/failed.log"; echo "tests failed"; }
echo "tests (exit $rc) done at $((SECONDS - s0)) s"
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
if [ "${mem:-0}" -ge 100000 ]; then P="--batches 1,256 --ctxs 1024"; else P="--batches 256 --ctxs 512"; fi
V="main occ4 inflight3"
[ $rc -ne 0 ] && V="main inflight3"
VT=$((B - (SECONDS - s0) - 90)); [ $VT -gt 360 ] && VT=360
OUT=$R/v RW_VARIANT_TIMEOUT=100 timeout $VT tools/gpu/run-variants.sh --rounds 3 $V -- $C \
    decode $P --steps 10 --gen 1,16,2 --gen-reps 1 --no-forward
python3 tools/bench/variant_lines.py "$R/v/variants.txt" --what "decode_bf16|decode_mxfp8"
mv "$R/v/variants.txt" "$R/n_variants.txt"; rm -rf "$R/v"
echo "variants done at $((SECONDS - s0)) s"
left=$((B - (SECONDS - s0)))
PV=occ4; [ $rc -ne 0 ] && PV=inflight3
if [ $left -ge 80 ]; then
    mkdir -p /tmp/pb/tools/bench && cp /tmp/rw-variants/rw-$PV /tmp/pb/tools/bench/rw-bench
    OUT=$R/p RW_BUILD_DIR=/tmp/pb timeout $((left - 10)) tools/gpu/kernel-profile.sh --quant --count 1 \
        'moe_gemm_kernel<.int.32, .int.1, .bool.1, .bool.1' > "$R/n_profile_log.txt" 2>&1
    cp "$R/p/profile.txt" "$R/n_profile_$PV.txt" 2>/dev/null
    rm -rf "$R/p"
    grep -E "Duration|DRAM Throughput|Issue Slots Busy|Eligible Warps|Registers Per|Achieved Occ" "$R/n_profile_$PV.txt" | head
    tail -3 "$R/n_profile_log.txt"
fi
echo "all took $((SECONDS - s0)) s"
