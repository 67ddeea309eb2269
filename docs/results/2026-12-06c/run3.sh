#!/usr/bin/env bash
# Session 35, call 3: split decode attention merging its partials in the kernel, one cluster of
# nsplit CTAs a tile and kv head (cmerge.patch, branch attn-cmerge), against main. Its tests
# first (tests_cm.txz), then the attention kernel alone (combine included) at 1 x 1k, 1 x 4k,
# 8 x 4k and 32 x 8k, and engine steps b32 / b8 / b1 at 1k and 4k in three rounds with a
# generate's digest. Archive: pack-variants base=- cm=cmerge.patch.
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader > "$R/r3_gpu.txt"
s0=$SECONDS
archive() { (cd "$R" && tar czf /tmp/r3_all.tgz . && find . -type f -delete && find . -mindepth 1 -type d -delete && mv /tmp/r3_all.tgz .); }
trap 'archive; exit 143' TERM
timeout 200 tools/gpu/run-packed.sh .gpu-pack/tests_cm.txz \
    --only "worker_(attention|gemm|invariance|rollout|kernels)_gpu|worker_cuda_vs_transformers_gpu" > "$R/r3_suite.txt" 2>&1
tail -8 "$R/r3_suite.txt"; grep -E "FAIL|TIMEOUT" "$R/r3_suite.txt" | head
[ -f "$R/failed.log" ] && tail -c 3000 "$R/failed.log"
echo "suite done at $((SECONDS - s0)) s"
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
V="base cm"
OUT=$R/attn RW_VARIANT_TIMEOUT=60 timeout 130 tools/gpu/run-variants.sh --rounds 2 $V -- $C \
    kernels --kernel-attention d1x1024,d1x4096,d8x4096,d32x8192 --expert-tokens 1 --dense-tokens 1 --small-tokens 1
python3 tools/bench/variant_lines.py "$R/attn/variants.txt" --what "attention" | tee "$R/r3_attn.txt"
OUT=$R/steps RW_VARIANT_TIMEOUT=90 timeout 300 tools/gpu/run-variants.sh --rounds 3 $V -- $C \
    decode --batches 32,8,1 --ctxs 1024,4096 --steps 20 --gen 4,300,8 --gen-reps 1 --no-quant --no-forward
python3 tools/bench/variant_lines.py "$R/steps/variants.txt" --what "decode_bf16|generate" | tee "$R/r3_steps.txt"
echo "all took $((SECONDS - s0)) s"
archive
