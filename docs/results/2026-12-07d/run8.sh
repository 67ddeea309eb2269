#!/usr/bin/env bash
# Forty-fifth session, call 8: the split's combine with more partials in flight. Its merge
# (atc_merge_col, worker/kernels/attention_merge.cuh) issues the loads of ATC_CU segments before
# merging them; the partials now mostly come from L2 (forty-fourth session), so the combine's
# time after the split kernel is round trips: 8 (main), 16 (cu16) or 32 (cu32) segments a batch,
# the same merges in the same order. The attention tests of the cu32 build first, then kernels
# and engine decode steps in turns.
# Archives: .gpu-pack/tests_cu32.txz; .gpu-pack/variants.txz (rw-main, rw-cu16, rw-cu32).
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$R/gpu.txt"
s0=$SECONDS
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
timeout 60 tools/gpu/run-packed.sh .gpu-pack/tests_cu32.txz \
    --only "worker_attention_gpu|worker_invariance_gpu|worker_invariance_high_gpu|worker_kernels_gpu" \
    > "$R/tests.txt" 2>&1
echo "tests exit $?"; tail -5 "$R/tests.txt"
[ -f "$R/failed.log" ] && { tail -c 3000 "$R/failed.log"; echo "tests failed"; }
run() { # name rounds args...
    local n=$1 r=$2; shift 2
    OUT=$R/v RW_VARIANT_TIMEOUT=60 timeout 170 tools/gpu/run-variants.sh --rounds "$r" main cu16 cu32 -- $C "$@"
    mv "$R/v/variants.txt" "$R/$n.txt"; rm -rf "$R/v"
}
run k 2 kernels --kernel-attention d32x8192,d8x8192,d16x4096,d8x4096,d1x4096,d1x1024 \
    --expert-tokens 1 --dense-tokens 1 --small-tokens 1
python3 tools/bench/variant_lines.py "$R/k.txt" --what attention
run d1 2 decode --batches 1,8 --ctxs 1024,8192 --steps 20 --gen 1,16,2 --gen-reps 1 \
    --no-quant --no-forward
python3 tools/bench/variant_lines.py "$R/d1.txt" --what decode
echo "all took $((SECONDS - s0)) s"
