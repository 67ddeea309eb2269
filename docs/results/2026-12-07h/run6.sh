#!/usr/bin/env bash
# Prepared in the forty-ninth session, not run: what holds the w13 pass's input-pair tile, now
# that its loads do not (call 15: the layer within 2-3% of main without them). The first four
# are timing only (their results are wrong); s2, b256p and dbar give main's bits:
#   mmaonly  the w13 input-pair tile loads nothing and waits on no copy: its barriers and MMAs
#   nosync   its loads, without the CTA barrier before each block's MMAs
#   mmans    both: the MMA groups and their waits alone
#   hionly   its loads and barriers with the hi products alone (half the MMAs)
#   s2       the same tile on two stages of 48 KB, two CTAs an SM (same bits; s2.patch)
#   b256p    the w13 input-pair tile 256 weight rows tall on three pipelined stages of 64 KB, its
#            loads issued by the MMA warps as in main (same bits; b256p.patch): b256 without the
#            producer warp that made wsp slow, each gathered row serving 6 row blocks, not 12
#   dbar     main's tile without the CTA barrier a block: per-stage full / empty barriers, each
#            thread's copies arriving on the stage's full barrier, each warp releasing a stage
#            once its MMAs retired (same bits; dbar.patch): the landable form of nosync
# If mmans is near the tensor rate (the layer's w13 share shrinking to its MMA time) and mmaonly
# is not, the barrier costs it; if hionly gains what the lo products cost at the MMA rate, the
# MMAs are the work and only their count or shape (n256, fewer shared-memory reads a product)
# moves it. The expert layer at 16,384 and 2048 tokens in turns, the GPU tests of s2, b256p and
# dbar, the 8 x 2k prefill of those three beside main; any card.
# Archives: tools/gpu/pack-variants.sh BUILD main=- s2=s2.patch b256p=b256p.patch
#   dbar=dbar.patch mmaonly=mmaonly.patch nosync=nosync.patch mmans=mmans.patch
#   hionly=hionly.patch; tests_s2.txz, tests_b256p.txz and tests_dbar.txz with each patch
#   applied (tools/gpu/pack-tests.sh).
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
s0=$SECONDS
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$R/v_gpu.txt"
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
RW_VARIANT_TIMEOUT=40 timeout 200 tools/gpu/run-variants.sh --rounds 2 \
    main s2 b256p dbar mmaonly nosync mmans hionly \
    -- $C kernels --kernel-attention p1x128 --expert-tokens 16384,2048 --dense-tokens 1 \
    > /dev/null 2>&1
mv "$R/variants.txt" "$R/v_kernels.txt"
python3 tools/bench/variant_lines.py "$R/v_kernels.txt" --what 'experts'
echo "kernels done at $((SECONDS - s0)) s"
for v in s2 b256p dbar; do
    timeout 100 tools/gpu/run-packed.sh .gpu-pack/tests_$v.txz \
        --only 'moe|invariance|kernels_gpu|transformers' > "$R/v_tests_$v.txt" 2>&1
    echo "$v tests exit $? at $((SECONDS - s0)) s"; tail -n 3 "$R/v_tests_$v.txt"
    [ -f "$R/failed.log" ] && mv "$R/failed.log" "$R/v_failed_$v.log"
    rm -f "$R/suite.txt"
done
RW_VARIANT_TIMEOUT=40 timeout 100 tools/gpu/run-variants.sh --rounds 1 main s2 b256p dbar \
    -- $C prefill --prefill-reps 2 --no-quant > /dev/null 2>&1
mv "$R/variants.txt" "$R/v_prefill.txt"
python3 tools/bench/variant_lines.py "$R/v_prefill.txt" --what 'prefill'
echo "call took $((SECONDS - s0)) s"
