#!/usr/bin/env bash
# Session 33, one call for what run1.sh and run2.sh would have done (seven device starts failed,
# so cut to about 260 s: b1 steps only): run2.sh's GEMV variants first, then the gpu-suite tests main has not
# run on a GPU yet (tests_main33.txz: worker_kernels_gpu's new RoPE widths against main's kernel,
# moe_experts_gpu, worker_bench_forward_gpu's small lines with the backend's frequencies), then
# bn32's gemm and invariance tests (tests_bn32.txz). Everything comes back as one archive.
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader > "$R/r3_gpu.txt"
s0=$SECONDS
# the device tool returns at most 8 files: everything as one archive, also when the call's time
# limit stops the script
archive() { (cd "$R" && tar czf /tmp/r3_all.tgz . && find . -type f -delete && mv /tmp/r3_all.tgz .); }
trap 'archive; exit 143' TERM
RUN2_LIMIT=100 RUN2_BATCHES=1 bash docs/results/2026-12-06a/run2.sh
echo "variants took $((SECONDS - s0)) s"
timeout 90 tools/gpu/run-packed.sh .gpu-pack/tests_main33.txz \
    --only "worker_(kernels|bench_forward)_gpu|moe_experts_gpu" > "$R/r1_suite.txt" 2>&1
tail -1 "$R/r1_suite.txt"; grep -E "FAIL|TIMEOUT" "$R/r1_suite.txt" | head
[ -f "$R/failed.log" ] && tail -c 2000 "$R/failed.log"
if [ $((SECONDS - s0)) -lt 440 ]; then
    RW_PACK_DIR=/tmp/rw-bn32 timeout 50 tools/gpu/run-packed.sh .gpu-pack/tests_bn32.txz \
        --only "worker_(gemm|invariance)_gpu" > "$R/r3_suite_bn32.txt" 2>&1
    tail -1 "$R/r3_suite_bn32.txt"; grep -E "FAIL" "$R/r3_suite_bn32.txt" | head
fi
echo "run3 took $((SECONDS - s0)) s"
archive
