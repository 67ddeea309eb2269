#!/usr/bin/env bash
# Session 36, call 3: the router's one-token group with only the norm's stores moved (nmout.patch,
# branch norm-out): the residual and the normed pair written by the cluster's other CTAs after
# the cluster barrier while the first CTA routes, as in call 2's rn but with the warp's routing
# kept (call 2: the CTA-wide routing alone was slower, rn level with main). Same bits expected.
# Tests first (tests_nmo.txz), then b1 / b8 steps at 1k and 4k, four rounds.
# Archive: pack-variants base=- nmout=nmout.patch.
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader > "$R/r3_gpu.txt"
s0=$SECONDS
timeout 170 tools/gpu/run-packed.sh .gpu-pack/tests_nmo.txz \
    --only "worker_(kernels|router|invariance|rollout)_gpu|worker_cuda_vs_transformers_gpu" > "$R/r3_suite.txt" 2>&1
tail -8 "$R/r3_suite.txt"; grep -E "FAIL|TIMEOUT" "$R/r3_suite.txt" | head
[ -f "$R/failed.log" ] && tail -c 3000 "$R/failed.log"
echo "suite done at $((SECONDS - s0)) s"
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
OUT=$R/steps RW_VARIANT_TIMEOUT=60 timeout 200 tools/gpu/run-variants.sh --rounds 4 base nmout -- $C \
    decode --batches 8,1 --ctxs 1024,4096 --steps 20 --gen 4,300,8 --gen-reps 1 --no-quant --no-forward
python3 tools/bench/variant_lines.py "$R/steps/variants.txt" --what "decode_bf16|generate" | tee "$R/r3_steps.txt"
mv "$R/steps/variants.txt" "$R/r3_steps_variants.txt"; rm -rf "$R/steps"
echo "all took $((SECONDS - s0)) s"
