#!/usr/bin/env bash
# Session 34, call 9: the one-token GEMV with its whole slice in flight but only part of it
# issued before the launch wait. ring8w: 8 stages, 4 before the wait (main's traffic under the
# kernel ahead) and 4 right after it; ring8w2: 2 before, 6 after. Separates the thirty-third
# session's two effects: fewer round trips in the GEMV (ring8 alone faster) against more weight
# traffic under the kernel ahead (ring8's steps slower). The dense lines alone at 1 and 8 tokens,
# then b8 and b1 at 1k and 4k with a generate's digest, three rounds in turns.
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader > "$R/r9_gpu.txt"
s0=$SECONDS
archive() { (cd "$R" && tar czf /tmp/r9_all.tgz . && find . -type f -delete && find . -mindepth 1 -type d -delete && mv /tmp/r9_all.tgz .); }
trap 'archive; exit 143' TERM
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
V="base ring8w ring8w2"
OUT=$R/dense RW_VARIANT_TIMEOUT=40 timeout 100 tools/gpu/run-variants.sh --rounds 1 $V -- $C \
    kernels --kernel-attention d1x1024 --expert-tokens 1 --dense-tokens 1,8 --small-tokens 1
python3 tools/bench/variant_lines.py "$R/dense/variants.txt" --what "proj|qkv" | tee "$R/r9_dense.txt"
OUT=$R/steps RW_VARIANT_TIMEOUT=60 timeout 220 tools/gpu/run-variants.sh --rounds 3 $V -- $C \
    decode --batches 8,1 --ctxs 1024,4096 --steps 20 --gen 4,300,8 --gen-reps 1 --no-quant --no-forward
python3 tools/bench/variant_lines.py "$R/steps/variants.txt" --what "decode_bf16|generate" | tee "$R/r9_steps.txt"
echo "all took $((SECONDS - s0)) s"
archive
