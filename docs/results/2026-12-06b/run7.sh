#!/usr/bin/env bash
# Session 34, call 7: how much of a one-token layer each small kernel's launch holds, as an upper
# bound on what fusing it away could save: main against main with one kernel left out at one
# token (wrong outputs, timing only): nocomb (the experts' combine + next input norm),
# norope (q/k norm + RoPE + KV write), noacomb (the split attention's combine). b1 at 1k and 4k,
# three rounds in turns. One archive back.
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader > "$R/r7_gpu.txt"
s0=$SECONDS
archive() { (cd "$R" && tar czf /tmp/r7_all.tgz . && find . -type f -delete && find . -mindepth 1 -type d -delete && mv /tmp/r7_all.tgz .); }
trap 'archive; exit 143' TERM
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
OUT=$R/steps RW_VARIANT_TIMEOUT=60 timeout 200 tools/gpu/run-variants.sh --rounds 3 base nocomb norope noacomb -- $C \
    decode --batches 1 --ctxs 1024,4096 --steps 20 --gen 1,16,2 --gen-reps 1 --no-quant --no-forward
python3 tools/bench/variant_lines.py "$R/steps/variants.txt" --what "decode_bf16" | tee "$R/r7_steps.txt"
echo "all took $((SECONDS - s0)) s"
archive
