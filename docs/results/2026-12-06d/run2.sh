#!/usr/bin/env bash
# Session 36, call 2: the router's one-token group (the cluster form) (rcta) routed by the whole
# routing CTA: warp 0 takes the softmax with the same code, then every thread ranks one expert's
# key against half of the others and the experts of rank < k are the picks, in order (the same
# picks, weights and sum as the warp's k rounds of reductions; a step with fewer than k
# probabilities that are not NaN keeps the rounds). (rn) the same, and the norm's stores (the
# residual and the normed pair, 0.6 us of the routing CTA's path in the thirty-fifth session's
# stamps) written by the cluster's other CTAs while the first routes. Same bits expected.
# Tests first (tests_rn.txz: router ties and NaN cases added), then b1 / b8 steps at 1k and 4k,
# three rounds. Archive: pack-variants base=- rn=rn.patch rcta=rcta.patch.
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader > "$R/r2_gpu.txt"
s0=$SECONDS
timeout 170 tools/gpu/run-packed.sh .gpu-pack/tests_rn.txz \
    --only "worker_(kernels|router|invariance|rollout)_gpu|moe_experts_gpu|worker_cuda_vs_transformers_gpu" > "$R/r2_suite.txt" 2>&1
tail -9 "$R/r2_suite.txt"; grep -E "FAIL|TIMEOUT" "$R/r2_suite.txt" | head
[ -f "$R/failed.log" ] && tail -c 3000 "$R/failed.log"
echo "suite done at $((SECONDS - s0)) s"
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
OUT=$R/steps RW_VARIANT_TIMEOUT=60 timeout 260 tools/gpu/run-variants.sh --rounds 3 base rn rcta -- $C \
    decode --batches 8,1 --ctxs 1024,4096 --steps 20 --gen 4,300,8 --gen-reps 1 --no-quant --no-forward
python3 tools/bench/variant_lines.py "$R/steps/variants.txt" --what "decode_bf16|generate" | tee "$R/r2_steps.txt"
mv "$R/steps/variants.txt" "$R/r2_steps_variants.txt"; rm -rf "$R/steps"
echo "all took $((SECONDS - s0)) s"
