#!/usr/bin/env bash
# Forty-first session, call 1: the fortieth session's next.sh with other variants. First the
# candidate's tests (tests_cand.txz: main + docs/results/2026-12-06h/trim.patch with
# MOE_QUANT_L2_PF 256), then in turns
# (mxfp8-last-8 b256 x 1k, bf16 beside it; x 512 on an H100, b1,256 x 1k on an H200):
#   main   main's tree (MOE_QUANT_L2_PF 0: the quantized tiles' weight copies without an L2 hint)
#   pf128  the weight copies ask L2 for the whole 128-byte line (cp.async ... .L2::128B)
#   pf256  ... for the aligned 256 bytes (.L2::256B): a stage reads 64 bytes of each of 128 rows
#          K bytes apart (the mxfp8 layout is not K-blocked), so each row's next blocks hit L2
#   trim   trim.patch: the stage and phase parity carried from block to block
# then main's mxfp8 w13 tile: its SASS (cuobjdump) and, with the time left, Nsight Compute.
# Prepare on the CPU machine, with the MOE_QUANT_L2_PF knob in the tree at 0:
#   tools/gpu/pack-variants.sh BUILD main=- pf128=MOE_QUANT_L2_PF=128 pf256=MOE_QUANT_L2_PF=256 \
#     trim=$(pwd)/docs/results/2026-12-06h/trim.patch
# Carry .deps and .gpu-pack; RW_CALL_BUDGET (seconds, default 480) bounds the script.
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$R/n_gpu.txt"
s0=$SECONDS
B=${RW_CALL_BUDGET:-480}
timeout 150 tools/gpu/run-packed.sh .gpu-pack/tests_cand.txz \
    --only "moe_experts_gpu|worker_invariance_gpu|worker_cuda_vs_transformers_gpu" > "$R/n_tests.txt" 2>&1
rc=$?
tail -5 "$R/n_tests.txt"; grep -h "quantized weights" /tmp/rw-packed/logs/*.log 2>/dev/null | sort -u
[ -f "$R/failed.log" ] && { tail -c 3000 "$R/failed.log"; echo "tests failed"; }
echo "tests (exit $rc) done at $((SECONDS - s0)) s"
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
if [ "${mem:-0}" -ge 100000 ]; then P="--batches 1,256 --ctxs 1024"; else P="--batches 256 --ctxs 512"; fi
V="main pf128 pf256 trim"
VT=$((B - (SECONDS - s0) - 90)); [ $VT -gt 330 ] && VT=330
OUT=$R/v RW_VARIANT_TIMEOUT=90 timeout $VT tools/gpu/run-variants.sh --rounds 3 $V -- $C \
    decode $P --steps 10 --gen 1,16,2 --gen-reps 1 --no-forward
python3 tools/bench/variant_lines.py "$R/v/variants.txt" --what "decode_bf16|decode_mxfp8"
mv "$R/v/variants.txt" "$R/n_variants.txt"; rm -rf "$R/v"
echo "variants done at $((SECONDS - s0)) s"
K=_Z15moe_gemm_kernelILi32ELi1ELb1ELb1ELi5ELb1ELi128EEv9gemm_args14CUtensorMap_st
CUOBJ=$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)
"$CUOBJ" -sass -fun "$K" /tmp/rw-variants/rw-main > "$R/n_sass_mx.txt" 2>&1
wc -l "$R/n_sass_mx.txt"
left=$((B - (SECONDS - s0)))
if [ $left -ge 80 ]; then
    mkdir -p /tmp/pb/tools/bench && cp /tmp/rw-variants/rw-main /tmp/pb/tools/bench/rw-bench
    OUT=$R/p RW_BUILD_DIR=/tmp/pb timeout $((left - 10)) tools/gpu/kernel-profile.sh --quant --count 1 \
        'moe_gemm_kernel<.int.32, .int.1, .bool.1, .bool.1' > "$R/n_profile_log.txt" 2>&1
    cp "$R/p/profile.txt" "$R/n_profile.txt" 2>/dev/null
    cp "$R/p/profile_sass.txt" "$R/n_profile_sass.txt" 2>/dev/null
    rm -rf "$R/p"
    grep -E "Duration|DRAM Throughput|Issue Slots Busy|Eligible Warps|Executed Instructions" "$R/n_profile.txt" | head
    tail -3 "$R/n_profile_log.txt"
fi
echo "all took $((SECONDS - s0)) s"
