#!/usr/bin/env bash
# Session 34, call 3: the decode attention staging the keys an earlier pass wrote before its
# launch wait (branch attn-fresh; variants.txz: base = main, fresh = fresh.patch). First its
# tests (tests_fresh.txz: worker_attention_gpu with the fresh-order case, the invariance,
# transformers and rollout tests), then engine steps in turns with a generate's outputs digest:
# b1 and b8 at 1k and b1 at 4k (three rounds), then b256 (x 1k on an H200, x 512 on an H100; two
# rounds). One archive back.
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader > "$R/r3_gpu.txt"
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
s0=$SECONDS
archive() { (cd "$R" && tar czf /tmp/r3_all.tgz . && find . -type f -delete && find . -mindepth 1 -type d -delete && mv /tmp/r3_all.tgz .); }
trap 'archive; exit 143' TERM
timeout 150 tools/gpu/run-packed.sh .gpu-pack/tests_fresh.txz \
    --only "worker_(attention|invariance|rollout)_gpu|worker_cuda_vs_transformers_gpu" > "$R/r3_suite.txt" 2>&1
tail -3 "$R/r3_suite.txt"; grep -E "FAIL|TIMEOUT" "$R/r3_suite.txt" | head
[ -f "$R/failed.log" ] && tail -c 3000 "$R/failed.log"
echo "suite done at $((SECONDS - s0)) s"
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
V="base fresh"
OUT=$R/steps RW_VARIANT_TIMEOUT=60 timeout 200 tools/gpu/run-variants.sh --rounds 3 $V -- $C \
    decode --batches 8,1 --ctxs 1024,4096 --steps 20 --gen 4,300,8 --gen-reps 1 --no-quant --no-forward
python3 tools/bench/variant_lines.py "$R/steps/variants.txt" --what "decode_bf16|generate" | tee "$R/r3_steps.txt"
echo "steps done at $((SECONDS - s0)) s"
ctx=512
[ "$mem" -gt 100000 ] && ctx=1024
OUT=$R/b256 RW_VARIANT_TIMEOUT=90 timeout 220 tools/gpu/run-variants.sh --rounds 2 $V -- $C \
    decode --batches 256 --ctxs $ctx --steps 20 --gen 1,16,2 --gen-reps 1 --no-quant --no-forward
python3 tools/bench/variant_lines.py "$R/b256/variants.txt" --what "decode_bf16" | tee "$R/r3_b256.txt"
echo "all took $((SECONDS - s0)) s"
archive
