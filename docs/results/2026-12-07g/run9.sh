#!/usr/bin/env bash
# Prepared in the forty-eighth session, not run: the pipelined 128-token expert tiles (bf16 with
# the input pair: w13 of every prefill, w2 with the activation pair) with a producer warp
# (wsp.patch, moe_wsp): one warp issues each stage's weight copy and gathered token rows as soon
# as the MMA warps have retired the stage's last block (an empty barrier a stage), and the two
# warpgroups only wait for the stage's full barrier, multiply and release it: no CTA barrier and
# no copy address work between their MMA groups, and the copies three blocks ahead instead of
# two without draining the tensor pipe. Same k16 steps in the same order, so the same bits
# (ptxas here: 92 registers against 116, no spills; the other kernels' machine code unchanged).
# wspw2 (wspw2.patch): wsp and the one-input w2 tile on four stages, so that it takes the
# producer too (four stages alone were 6% slower: one CTA an SM; run6.sh). First wsp's GPU tests
# (moe_experts_gpu compares wide tiles with each token alone on narrow ones), then the expert
# layer at 16,384 and 2048 tokens in turns, then the 8 x 2k prefill; any card.
# Archives: tools/gpu/pack-variants.sh BUILD main=- wsp=wsp.patch wspw2=wspw2.patch;
#   git apply wsp.patch && tools/gpu/pack-tests.sh BUILD .gpu-pack/tests_wsp.txz
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$R/w_gpu.txt"
s0=$SECONDS
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
timeout 150 tools/gpu/run-packed.sh .gpu-pack/tests_wsp.txz \
    --only 'moe|invariance|kernels_gpu|transformers' > "$R/w_tests.txt" 2>&1
rc=$?
echo "tests exit $rc at $((SECONDS - s0)) s"; tail -n 10 "$R/w_tests.txt"
[ -f "$R/failed.log" ] && tail -n 40 "$R/failed.log"
rm -f "$R/suite.txt"
RW_VARIANT_TIMEOUT=40 timeout 150 tools/gpu/run-variants.sh --rounds 2 main wsp wspw2 \
    -- $C kernels --kernel-attention p1x128 --expert-tokens 16384,2048 --dense-tokens 1 \
    > /dev/null 2>&1
mv "$R/variants.txt" "$R/w_kernels.txt"
python3 tools/bench/variant_lines.py "$R/w_kernels.txt" --what 'experts'
RW_VARIANT_TIMEOUT=40 timeout 120 tools/gpu/run-variants.sh --rounds 1 main wsp wspw2 \
    -- $C prefill --prefill-reps 2 --no-quant > /dev/null 2>&1
mv "$R/variants.txt" "$R/w_prefill.txt"
python3 tools/bench/variant_lines.py "$R/w_prefill.txt" --what 'prefill'
echo "all took $((SECONDS - s0)) s"
