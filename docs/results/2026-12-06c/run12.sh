#!/usr/bin/env bash
# Session 35, call 12: the one-token sort (moe/sort.cuh's rw_moe_sort_one_token_warp, run by the
# router's routing CTA) from a bit set of the picks: popcounts and one warp scan instead of a
# loop over the picks for each of the E + 1 offsets (sort1.patch, branch sort-bits; call 6's
# stamps put the sort at 2.1-2.3 us a layer). Integer outputs, the same by construction (a
# Python model of both forms agreed on 20,000 random pick sets, duplicates and invalid ids
# included). Tests first (tests_srt.txz), then b1 / b8 steps at 1k and 4k, four rounds.
# Archive: pack-variants base=- srt=sort1.patch.
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader > "$R/r12_gpu.txt"
s0=$SECONDS
timeout 150 tools/gpu/run-packed.sh .gpu-pack/tests_srt.txz \
    --only "worker_(router|invariance|rollout)_gpu|moe_experts_gpu|worker_cuda_vs_transformers_gpu" > "$R/r12_suite.txt" 2>&1
tail -7 "$R/r12_suite.txt"; grep -E "FAIL|TIMEOUT" "$R/r12_suite.txt" | head
[ -f "$R/failed.log" ] && tail -c 2000 "$R/failed.log"
echo "suite done at $((SECONDS - s0)) s"
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
OUT=$R/steps RW_VARIANT_TIMEOUT=60 timeout 200 tools/gpu/run-variants.sh --rounds 4 base srt -- $C \
    decode --batches 8,1 --ctxs 1024,4096 --steps 20 --gen 4,300,8 --gen-reps 1 --no-quant --no-forward
python3 tools/bench/variant_lines.py "$R/steps/variants.txt" --what "decode_bf16|generate" | tee "$R/r12_steps.txt"
mv "$R/steps/variants.txt" "$R/r12_steps_variants.txt"; rm -rf "$R/steps"
echo "all took $((SECONDS - s0)) s"
