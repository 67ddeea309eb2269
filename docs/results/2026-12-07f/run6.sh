#!/usr/bin/env bash
# Prepared in the forty-seventh session, not run: where the prefill's expert GEMMs spend their
# instructions and stalls, as the prefill attention's profile showed this session (the experts
# are about half of an 8 x 2k prefill: 275 of 520 ms in the twenty-third session's per-phase
# table, and their last profile is the sixth session's). Nsight Compute of the w13 and w2
# passes at 16,384 routed tokens with the input pair (rw-bench kernels' "experts" line), their
# sections and SASS tables; on any card, about 90 s on a warm one.
# Archive: .gpu-pack/variants.txz with rw-main (pack-variants.sh BUILD main=-).
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$R/m_gpu.txt"
s0=$SECONDS
X=/tmp/rw-variants/rw-main
[ -x "$X" ] || { mkdir -p /tmp/rw-variants && tar xf .gpu-pack/variants.txz -C /tmp/rw-variants; }
# the warm-up call's w13 and w2 launches are skipped; the next two are the timed call's
RW_BENCH=$X OUT=/tmp/kp timeout 200 tools/gpu/kernel-profile.sh --kernels \
    "--kernel-attention p1x128 --expert-tokens 16384 --dense-tokens 1 --reps 1 --warmup 1" \
    --skip 2 --count 2 moe_gemm_kernel > "$R/m_ncu_moe_sass.txt" 2>&1
echo "kernel-profile exit $? at $((SECONDS - s0)) s"
cp /tmp/kp/profile.txt "$R/m_ncu_moe.txt"
grep -E "moe_gemm_kernel|Duration|Issue Slots Busy|No Eligible|Registers Per|Achieved Occupancy|Warp Cycles Per Issued|DRAM Throughput|Tensor" \
    "$R/m_ncu_moe.txt" | head -30
head -60 "$R/m_ncu_moe_sass.txt"
echo "all took $((SECONDS - s0)) s"
