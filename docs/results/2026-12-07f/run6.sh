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
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
# the warm-up call's w13 and w2 launches are skipped; the next two are the timed call's
timeout 200 ncu --kernel-name-base demangled -k regex:moe_gemm_kernel --launch-skip 2 \
    --launch-count 2 --set full --import-source no -f -o "$R/ncu_moe" $X $C kernels \
    --kernel-attention p1x128 --expert-tokens 16384 --dense-tokens 1 --reps 1 --warmup 1 \
    > /tmp/ncu_run.log 2>&1
echo "ncu exit $? at $((SECONDS - s0)) s"; tail -3 /tmp/ncu_run.log
ncu --import "$R/ncu_moe.ncu-rep" --page details > "$R/m_ncu_moe.txt" 2>&1
ncu --import "$R/ncu_moe.ncu-rep" --page source --csv --print-source sass > /tmp/ncu_sass.csv 2>&1
python3 tools/bench/sass_table.py /tmp/ncu_sass.csv --top 30 > "$R/m_ncu_moe_sass.txt" 2>&1
rm -f "$R/ncu_moe.ncu-rep"
grep -E "moe_gemm_kernel|Duration|Issue Slots Busy|No Eligible|Registers Per|Achieved Occupancy|Warp Cycles Per Issued|DRAM Throughput|Tensor" \
    "$R/m_ncu_moe.txt" | head -30
head -60 "$R/m_ncu_moe_sass.txt"
echo "all took $((SECONDS - s0)) s"
