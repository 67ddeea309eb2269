#!/usr/bin/env bash
# The fortieth session's call 2 (branch twg-decouple; run1.sh never started: no machine came).
# The two-warpgroup 32-token expert tiles on per-stage full / empty barriers instead of one CTA
# barrier a K block: mxfp8 (the prepared decouple.patch) and bf16 (added this session). First
# the expert, invariance and CUDA-vs-CPU tests on the tree with both (tests_twg.txz: a hang or a
# wrong byte stops here), then, in turns, three builds of that tree:
#   off  = MOE_DEC_MX=0,MOE_DEC_BF16=0 (the barrier form everywhere: main's code),
#   mx   = MOE_DEC_BF16=0 (mxfp8 decoupled), both = as committed,
# mxfp8-last-8 at b256 x 1k and bf16 beside it (x 512 on an H100; b1,256 x 1k on an H200),
# three rounds; then, with the time left, the decoupled mxfp8 w13 tile under Nsight Compute.
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$R/c2_gpu.txt"
s0=$SECONDS
B=${RW_CALL_BUDGET:-560}
timeout 200 tools/gpu/run-packed.sh .gpu-pack/tests_twg.txz \
    --only "moe_experts_gpu|worker_invariance_gpu|worker_cuda_vs_transformers_gpu" > "$R/c2_tests.txt" 2>&1
rc=$?
tail -5 "$R/c2_tests.txt"; grep -h "quantized weights" /tmp/rw-packed/logs/*.log 2>/dev/null | sort -u
[ -f "$R/failed.log" ] && { tail -c 3000 "$R/failed.log"; echo "tests failed: no timing"; exit 1; }
[ $rc -ne 0 ] && { tail -c 2000 /tmp/rw-packed/logs/*.log 2>/dev/null | tail -40; echo "tests exit $rc (124: a hang): no timing"; exit 1; }
echo "tests done at $((SECONDS - s0)) s"
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
if [ "${mem:-0}" -ge 100000 ]; then P="--batches 1,256 --ctxs 1024"; else P="--batches 256 --ctxs 512"; fi
VT=$((B - (SECONDS - s0) - 90))
OUT=$R/v RW_VARIANT_TIMEOUT=90 timeout $VT tools/gpu/run-variants.sh --rounds 3 off mx both -- $C \
    decode $P --steps 10 --gen 1,16,2 --gen-reps 1 --no-forward
python3 tools/bench/variant_lines.py "$R/v/variants.txt" --what "decode_bf16|decode_mxfp8"
mv "$R/v/variants.txt" "$R/c2_variants.txt"; rm -rf "$R/v"
echo "variants done at $((SECONDS - s0)) s"
left=$((B - (SECONDS - s0)))
if [ $left -ge 80 ]; then
    mkdir -p /tmp/pb/tools/bench && cp /tmp/rw-variants/rw-both /tmp/pb/tools/bench/rw-bench
    OUT=$R/p RW_BUILD_DIR=/tmp/pb timeout $((left - 10)) tools/gpu/kernel-profile.sh --quant --count 1 \
        'moe_gemm_kernel<.int.32, .int.1, .bool.1, .bool.1' > "$R/c2_profile_log.txt" 2>&1
    cp "$R/p/profile.txt" "$R/c2_profile.txt" 2>/dev/null
    cp "$R/p/profile_sass.txt" "$R/c2_profile_sass.txt" 2>/dev/null
    rm -rf "$R/p"
    grep -E "Duration|DRAM Throughput|Issue Slots Busy|Eligible Warps|Executed Instructions  " "$R/c2_profile.txt" | head
fi
echo "all took $((SECONDS - s0)) s"
