#!/usr/bin/env bash
# Session 36, call 6 (H100): the w13 pass's token rows one round trip sooner (pe.patch, branch
# perm-early): each thread loads its rows' perm entries beside the expert's row count instead of
# after it (rows up to the pass's assignments, in bounds; entries past the expert's rows unused).
# With call 5's afirst the weights go out one round trip after the wait and the first stage's
# token rows three; this makes it two. Same bits expected. Tests first (tests_pe.txz), then b1 /
# b8 steps at 1k and 4k (four rounds), b256 x 512 (two rounds).
# Archive: pack-variants base=- pe=pe.patch (base: main b44d9fa).
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader > "$R/r6_gpu.txt"
s0=$SECONDS
timeout 170 tools/gpu/run-packed.sh .gpu-pack/tests_pe.txz \
    --only "worker_(kernels|router|invariance|rollout)_gpu|moe_experts_gpu|worker_cuda_vs_transformers_gpu" > "$R/r6_suite.txt" 2>&1
tail -8 "$R/r6_suite.txt"; grep -E "FAIL|TIMEOUT" "$R/r6_suite.txt" | head
[ -f "$R/failed.log" ] && tail -c 3000 "$R/failed.log"
echo "suite done at $((SECONDS - s0)) s"
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
OUT=$R/steps RW_VARIANT_TIMEOUT=60 timeout 200 tools/gpu/run-variants.sh --rounds 4 base pe -- $C \
    decode --batches 8,1 --ctxs 1024,4096 --steps 20 --gen 4,300,8 --gen-reps 1 --no-quant --no-forward
python3 tools/bench/variant_lines.py "$R/steps/variants.txt" --what "decode_bf16|generate" | tee "$R/r6_steps.txt"
OUT=$R/b256 RW_VARIANT_TIMEOUT=90 timeout 150 tools/gpu/run-variants.sh --rounds 2 base pe -- $C \
    decode --batches 256 --ctxs 512 --steps 10 --gen 1,16,2 --gen-reps 1 --no-quant --no-forward
python3 tools/bench/variant_lines.py "$R/b256/variants.txt" --what "decode_bf16" | tee "$R/r6_b256.txt"
mv "$R/steps/variants.txt" "$R/r6_steps_variants.txt"; mv "$R/b256/variants.txt" "$R/r6_b256_variants.txt"
rm -rf "$R/steps" "$R/b256"
echo "all took $((SECONDS - s0)) s"
