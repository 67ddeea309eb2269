#!/usr/bin/env bash
# Session 36, call 1. (a) The expert combine + norm of a step of at most 8 tokens over a cluster
# of 8 CTAs a token (cnl.patch, branch cnorm-cl): each CTA combines 256 of the row's 2048
# elements, pushes its sums into every CTA's shared memory, and all norm the whole row with the
# same norm_row (same bits); cnlall: the same form at every batch. (b) The router's logits
# tiles for 65-256 tokens: 16 tokens by 16 experts a CTA (rt21) or 16 by 32 (rt22, the prefill
# shape) instead of 8 by 16 (shape changes which CTA computes a logit, not its bits).
# Tests first on cnl + rt21 (tests_cr.txz), then b1 / b8 steps at 1k and 4k (three rounds),
# b256 x 512 steps (two rounds). Archive: pack-variants base=- cnl cnlall rt21 rt22.
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader > "$R/r1_gpu.txt"
s0=$SECONDS
timeout 170 tools/gpu/run-packed.sh .gpu-pack/tests_cr.txz \
    --only "worker_(kernels|router|invariance|rollout)_gpu|moe_experts_gpu|worker_cuda_vs_transformers_gpu" > "$R/r1_suite.txt" 2>&1
tail -9 "$R/r1_suite.txt"; grep -E "FAIL|TIMEOUT" "$R/r1_suite.txt" | head
[ -f "$R/failed.log" ] && tail -c 2000 "$R/failed.log"
echo "suite done at $((SECONDS - s0)) s"
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
OUT=$R/steps RW_VARIANT_TIMEOUT=60 timeout 200 tools/gpu/run-variants.sh --rounds 3 base cnl -- $C \
    decode --batches 8,1 --ctxs 1024,4096 --steps 20 --gen 4,300,8 --gen-reps 1 --no-quant --no-forward
python3 tools/bench/variant_lines.py "$R/steps/variants.txt" --what "decode_bf16|generate" | tee "$R/r1_steps.txt"
echo "steps done at $((SECONDS - s0)) s"
OUT=$R/b256 RW_VARIANT_TIMEOUT=90 timeout 210 tools/gpu/run-variants.sh --rounds 2 base cnlall rt21 rt22 -- $C \
    decode --batches 256 --ctxs 512 --steps 10 --gen 1,16,2 --gen-reps 1 --no-quant --no-forward
python3 tools/bench/variant_lines.py "$R/b256/variants.txt" --what "decode_bf16" | tee "$R/r1_b256.txt"
mv "$R/steps/variants.txt" "$R/r1_steps_variants.txt"; mv "$R/b256/variants.txt" "$R/r1_b256_variants.txt"
rm -rf "$R/steps" "$R/b256"
echo "all took $((SECONDS - s0)) s"
