#!/usr/bin/env bash
# Call 1 of the plan in docs/results/2026-12-05/README.md: the whole gpu suite on main +
# next_run2.patch (tests_next_run2.txz was built from that tree; apply the patch to the working
# tree first so the sources the tests read match). Then the two prefill attention kernels timed
# in one process (attention_prefill and attention_prefill_mma lines) and the wgmma one under
# Nsight Compute.
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > "$R/r1_gpu.txt" 2>&1
timeout 330 tools/gpu/run-packed.sh .gpu-pack/tests_next_run2.txz --jobs 3 > "$R/r1_suite.txt" 2>&1
echo "suite rc=$?" >> "$R/r1_suite.txt"
B=/tmp/rw-variants/rw-base
[ -x "$B" ] || { mkdir -p /tmp/rw-variants && tar xf .gpu-pack/variants.txz -C /tmp/rw-variants; }
timeout 60 "$B" --config tools/configs/qwen3-30b-a3b.json kernels --kernel-attention p8x2048,p1x8192 \
    --expert-tokens 1 --dense-tokens 1 > "$R/r1_attn_prefill.jsonl" 2>&1
# the wgmma kernel under Nsight Compute: one launch of the 8 x 2k prefill (the second, after the
# warm-up), its speed of light, issue and warp states
command -v ncu > /dev/null && timeout 150 ncu --kernel-name-base demangled -k regex:atw_kernel \
    --launch-skip 1 --launch-count 1 --section SpeedOfLight --section ComputeWorkloadAnalysis \
    --section SchedulerStats --section WarpStateStats --section Occupancy \
    --section MemoryWorkloadAnalysis "$B" --config tools/configs/qwen3-30b-a3b.json kernels \
    --kernel-attention p8x2048 --expert-tokens 1 --dense-tokens 1 > "$R/r1_ncu_atw.txt" 2>&1
tail -40 "$R/r1_suite.txt"
grep -h 'attention_prefill' "$R/r1_attn_prefill.jsonl" | cut -c1-240
grep -E "Duration|Throughput|Issue Slots Busy|No Eligible|Registers|Achieved Occupancy" "$R/r1_ncu_atw.txt" | head -30
