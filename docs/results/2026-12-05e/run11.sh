#!/usr/bin/env bash
# Session 26, call 5: the gpu suite on what lands (main + keep256 with the padding rule for the
# 128 x 256 tile: tests_s26b), then that tree's dense GEMMs at 129, 256, 384 and 2048 tokens.
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
timeout 240 tools/gpu/run-packed.sh .gpu-pack/tests_s26b.txz > "$R/r11_suite.txt" 2>&1
tail -3 "$R/r11_suite.txt"
grep -E "FAIL|gemm_gpu|kernels_gpu|invariance" "$R/r11_suite.txt" | head
[ -f "$R/failed.log" ] && mv "$R/failed.log" "$R/r11_failed.log"
rm -f "$R/suite.txt"
tools/gpu/run-packed.sh .gpu-pack/tests_s26b.txz --unpack-only > /dev/null 2>&1
B=${RW_PACK_DIR:-/tmp/rw-packed}
timeout 100 "$(find "$B" -name rw-bench -type f | head -1)" \
    --config "$(pwd)/tools/configs/qwen3-30b-a3b.json" kernels --kernel-attention d1x1024 \
    --expert-tokens 1 --dense-tokens 129,256,384,2048 > "$R/r11_dense.txt" 2>&1
grep -o '"what":"dense_[a-z_]*m[0-9]*"\|"median_s":[0-9.e-]*\|"vs_cublaslt":[0-9.]*' "$R/r11_dense.txt" | paste - - - 
