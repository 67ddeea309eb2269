#!/usr/bin/env bash
# Forty-sixth session: the prefill attention with the second softmax block's q'.K^T products
# issued before the first one's softmax (pipe.patch), on any card, each part where what is left
# of RW_CALL_BUDGET seconds allows: main and pipe in turns on the prefill attention kernel
# alone; pipe's attention, invariance and CUDA-vs-transformers tests; torch SDPA on the same
# prefill shape; an 8 x 2k prefill of each (G4's line); the kernel's machine code in both.
# Archives: .gpu-pack/variants.txz (rw-main of f11813e, rw-pipe), .gpu-pack/tests_pipe.txz.
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$R/e_gpu.txt"
s0=$SECONDS
B=${RW_CALL_BUDGET:-380}
left() { echo $((B - (SECONDS - s0))); }
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
RW_VARIANT_TIMEOUT=40 timeout 100 tools/gpu/run-variants.sh --rounds 3 main pipe -- $C kernels \
    --kernel-attention p8x2048,p1x8192 --expert-tokens 1 --dense-tokens 1 > /dev/null 2>&1
mv "$R/variants.txt" "$R/e_kernels.txt"
python3 tools/bench/variant_lines.py "$R/e_kernels.txt" --what 'attention'
echo "kernels at $((SECONDS - s0)) s"
if [ "$(left)" -ge 60 ]; then
    t=$(left); [ $t -gt 150 ] && t=150
    timeout $t tools/gpu/run-packed.sh .gpu-pack/tests_pipe.txz \
        --only 'attention|invariance|kernels_gpu|transformers' > "$R/e_tests.txt" 2>&1
    echo "tests exit $? at $((SECONDS - s0)) s"; tail -n 12 "$R/e_tests.txt"
    [ -f "$R/failed.log" ] && tail -n 40 "$R/failed.log"
fi
if [ "$(left)" -ge 50 ]; then
    grep -h '"attention_prefill"' "$R/e_kernels.txt" | head -1 > "$R/e_rw_attn.jsonl"
    timeout 45 python3 tools/peer/torch_kernels.py --kernel-attention p8x2048 \
        --expert-tokens 1 --rw "$R/e_rw_attn.jsonl" > "$R/e_peer.jsonl" 2> "$R/e_peer.err"
    grep -h '"compare"' "$R/e_peer.jsonl" | cut -c1-300
    echo "peer at $((SECONDS - s0)) s"
fi
if [ "$(left)" -ge 90 ]; then
    RW_VARIANT_TIMEOUT=$((($(left) - 15) / 2)) timeout $(($(left) - 10)) \
        tools/gpu/run-variants.sh --rounds 1 main pipe -- $C prefill --prefill-reps 2 --no-quant \
        > /dev/null 2>&1
    mv "$R/variants.txt" "$R/e_prefill.txt"
    python3 tools/bench/variant_lines.py "$R/e_prefill.txt" --what 'prefill'
fi
# the prefill kernel's machine code in both builds (where its MMAs sit against the softmax)
F=_Z10atc_kernelILi128ELb0EEvPKfPKtS3_S3_S3_PK12rw_attn_tilePKiS8_iiiiifPtS9_PfP6float2li
for v in main pipe; do
    timeout 20 cuobjdump -sass -fun "$F" /tmp/rw-variants/rw-$v 2>&1 | xz > "$R/e_sass_$v.txt.xz"
done
echo "all took $((SECONDS - s0)) s"
