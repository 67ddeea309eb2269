#!/usr/bin/env bash
# Forty-fifth session, call 11: the ready counters as they land (final: only for split launches
# of at least 16 tokens; call 10's build used them at every batch). Its attention tests (with the
# new 20-token decode cases), then the attention kernels and b1 engine steps in turns against
# main, 2 rounds.
# Archives: .gpu-pack/tests_final.txz; .gpu-pack/variants.txz (rw-main, rw-final).
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$R/gpu.txt"
s0=$SECONDS
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
timeout 70 tools/gpu/run-packed.sh .gpu-pack/tests_final.txz \
    --only "worker_attention_gpu|worker_invariance_gpu|worker_invariance_high_gpu|worker_kernels_gpu|worker_cuda_vs_transformers_gpu|worker_cuda_vs_transformers_high_gpu|worker_bench_forward_gpu|worker_rollout_gpu" \
    > "$R/tests.txt" 2>&1
rc=$?
echo "tests exit $rc"; tail -9 "$R/tests.txt"
[ -f "$R/failed.log" ] && { tail -c 3000 "$R/failed.log"; echo "tests failed"; }
[ $rc -eq 0 ] || exit 1
run() { # name rounds args...
    local n=$1 r=$2; shift 2
    OUT=$R/v RW_VARIANT_TIMEOUT=60 timeout 100 tools/gpu/run-variants.sh --rounds "$r" main final -- $C "$@"
    mv "$R/v/variants.txt" "$R/$n.txt"; rm -rf "$R/v"
}
run k 2 kernels --kernel-attention d32x8192,d16x4096,d8x8192,d1x4096,d1x1024 \
    --expert-tokens 1 --dense-tokens 1 --small-tokens 1
python3 tools/bench/variant_lines.py "$R/k.txt" --what attention
run d1 2 decode --batches 1 --ctxs 1024,8192 --steps 20 --gen 1,16,2 --gen-reps 1 \
    --no-quant --no-forward
python3 tools/bench/variant_lines.py "$R/d1.txt" --what decode
echo "all took $((SECONDS - s0)) s"
