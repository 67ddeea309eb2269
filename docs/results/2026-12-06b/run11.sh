#!/usr/bin/env bash
# Session 34, call 11: the one-token GEMV's slice sum with all S remote partials loaded before
# the adds (gvred.patch; call 10's stamps put 1.7-2.0 us between the last slice's end and the
# kernel's). Its tests first (tests_gvred.txz: worker_gemm_gpu, worker_invariance_gpu,
# worker_cuda_vs_transformers_gpu), then base against gvred: the dense lines alone at 1 and 8
# tokens, b8 and b1 at 1k and 4k with a generate's digest, three rounds in turns. One archive.
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader > "$R/r11_gpu.txt"
s0=$SECONDS
archive() { (cd "$R" && tar czf /tmp/r11_all.tgz . && find . -type f -delete && find . -mindepth 1 -type d -delete && mv /tmp/r11_all.tgz .); }
trap 'archive; exit 143' TERM
timeout 100 tools/gpu/run-packed.sh .gpu-pack/tests_gvred.txz \
    --only "worker_(gemm|invariance)_gpu|worker_cuda_vs_transformers_gpu" > "$R/r11_suite.txt" 2>&1
tail -4 "$R/r11_suite.txt"; grep -E "FAIL|TIMEOUT" "$R/r11_suite.txt" | head
[ -f "$R/failed.log" ] && tail -c 2000 "$R/failed.log"
echo "suite done at $((SECONDS - s0)) s"
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
V="base gvred"
OUT=$R/dense RW_VARIANT_TIMEOUT=40 timeout 60 tools/gpu/run-variants.sh --rounds 1 $V -- $C \
    kernels --kernel-attention d1x1024 --expert-tokens 1 --dense-tokens 1,8 --small-tokens 1
python3 tools/bench/variant_lines.py "$R/dense/variants.txt" --what "proj|qkv" | tee "$R/r11_dense.txt"
OUT=$R/steps RW_VARIANT_TIMEOUT=60 timeout 150 tools/gpu/run-variants.sh --rounds 3 $V -- $C \
    decode --batches 8,1 --ctxs 1024,4096 --steps 20 --gen 4,300,8 --gen-reps 1 --no-quant --no-forward
python3 tools/bench/variant_lines.py "$R/steps/variants.txt" --what "decode_bf16|generate" | tee "$R/r11_steps.txt"
echo "all took $((SECONDS - s0)) s"
archive
