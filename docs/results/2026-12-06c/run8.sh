#!/usr/bin/env bash
# Session 35, call 8: call 7's prefetch moved where it fits. Call 7 issued the next layer's q/k/v
# weight (21 MB) as L2 prefetches from the router's 8 CTAs and made b1 steps 24% slower (each
# SM's bulk-copy queue took 2.6 MB); the evict-first cp.async of its second variant hit an
# illegal instruction (a known ptxas fault of fractional policies on cp.async). Here (branch
# l2-prefetch2): l2a: the one-token w13 pass's 192 CTAs prefetch it before their launch wait,
# 4 KB a thread, with an evict-last policy (no cp.async involved); l2b: l2a and the GEMVs'
# tensor copies evict-first, so the lines leave L2 once read. Tests of l2b first, then b1 / b8
# steps at 1k and 4k, four rounds in turns. Archive: pack-variants base=- l2a=l2a.patch
# l2b=l2b.patch.
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader > "$R/r8_gpu.txt"
s0=$SECONDS
archive() { (cd "$R" && tar czf /tmp/r8_all.tgz . && find . -type f -delete && find . -mindepth 1 -type d -delete && mv /tmp/r8_all.tgz .); }
trap 'archive; exit 143' TERM
timeout 200 tools/gpu/run-packed.sh .gpu-pack/tests_l2b.txz \
    --only "worker_(router|gemm|invariance|rollout|kernels)_gpu|moe_experts_gpu|worker_cuda_vs_transformers_gpu" > "$R/r8_suite.txt" 2>&1
tail -9 "$R/r8_suite.txt"; grep -E "FAIL|TIMEOUT" "$R/r8_suite.txt" | head
[ -f "$R/failed.log" ] && tail -c 3000 "$R/failed.log"
echo "suite done at $((SECONDS - s0)) s"
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
V="base l2a l2b"
OUT=$R/steps RW_VARIANT_TIMEOUT=60 timeout 330 tools/gpu/run-variants.sh --rounds 4 $V -- $C \
    decode --batches 8,1 --ctxs 1024,4096 --steps 20 --gen 4,300,8 --gen-reps 1 --no-quant --no-forward
python3 tools/bench/variant_lines.py "$R/steps/variants.txt" --what "decode_bf16|generate" | tee "$R/r8_steps.txt"
echo "all took $((SECONDS - s0)) s"
archive
