#!/usr/bin/env bash
# Session 34, call 5: early = fresh with the RoPE kernel letting the attention be scheduled before
# its own wait (rw_pdl_begin_early), so the keys of earlier passes are copied under the q/k/v
# GEMV rather than under RoPE's last microsecond. base = main, fresh = fresh.patch, early =
# early.patch. b8 and b1 at 1k and b1 at 4k, three rounds in turns, then b256 x 512 (x 1k on an
# H200), two rounds. One archive back.
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader > "$R/r5_gpu.txt"
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
s0=$SECONDS
archive() { (cd "$R" && tar czf /tmp/r5_all.tgz . && find . -type f -delete && find . -mindepth 1 -type d -delete && mv /tmp/r5_all.tgz .); }
trap 'archive; exit 143' TERM
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
V="base fresh early"
OUT=$R/steps RW_VARIANT_TIMEOUT=60 timeout 200 tools/gpu/run-variants.sh --rounds 3 $V -- $C \
    decode --batches 8,1 --ctxs 1024,4096 --steps 20 --gen 4,300,8 --gen-reps 1 --no-quant --no-forward
python3 tools/bench/variant_lines.py "$R/steps/variants.txt" --what "decode_bf16|generate" | tee "$R/r5_steps.txt"
echo "steps done at $((SECONDS - s0)) s"
ctx=512
[ "$mem" -gt 100000 ] && ctx=1024
OUT=$R/b256 RW_VARIANT_TIMEOUT=90 timeout 200 tools/gpu/run-variants.sh --rounds 2 $V -- $C \
    decode --batches 256 --ctxs $ctx --steps 20 --gen 1,16,2 --gen-reps 1 --no-quant --no-forward
python3 tools/bench/variant_lines.py "$R/b256/variants.txt" --what "decode_bf16" | tee "$R/r5_b256.txt"
echo "all took $((SECONDS - s0)) s"
archive
