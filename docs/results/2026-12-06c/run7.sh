#!/usr/bin/env bash
# Session 35, call 7: the next layer's q/k/v weight prefetched into L2 by the one-token router
# while the routing leaves memory idle (call 6's stamps: nothing streams from the router's wait to
# the w13 pass's, about 8.5 us a layer), alone (pf) and with the one-token expert tiles loading
# their weights evict-first so the 75 MB they stream do not push the prefetched lines out (pfx).
# Tests of pfx first (tests_pfx.txz, branch l2-prefetch), then b1 / b8 steps at 1k and 4k, four
# rounds in turns. Archive: pack-variants base=- pf=pf.patch pfx=pfx.patch.
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader > "$R/r7_gpu.txt"
s0=$SECONDS
archive() { (cd "$R" && tar czf /tmp/r7_all.tgz . && find . -type f -delete && find . -mindepth 1 -type d -delete && mv /tmp/r7_all.tgz .); }
trap 'archive; exit 143' TERM
timeout 200 tools/gpu/run-packed.sh .gpu-pack/tests_pfx.txz \
    --only "worker_(router|gemm|invariance|rollout|kernels)_gpu|moe_experts_gpu|worker_cuda_vs_transformers_gpu" > "$R/r7_suite.txt" 2>&1
tail -9 "$R/r7_suite.txt"; grep -E "FAIL|TIMEOUT" "$R/r7_suite.txt" | head
[ -f "$R/failed.log" ] && tail -c 3000 "$R/failed.log"
echo "suite done at $((SECONDS - s0)) s"
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
V="base pf pfx"
OUT=$R/steps RW_VARIANT_TIMEOUT=60 timeout 330 tools/gpu/run-variants.sh --rounds 4 $V -- $C \
    decode --batches 8,1 --ctxs 1024,4096 --steps 20 --gen 4,300,8 --gen-reps 1 --no-quant --no-forward
python3 tools/bench/variant_lines.py "$R/steps/variants.txt" --what "decode_bf16|generate" | tee "$R/r7_steps.txt"
echo "all took $((SECONDS - s0)) s"
archive
