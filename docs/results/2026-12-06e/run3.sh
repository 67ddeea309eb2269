#!/usr/bin/env bash
# Session 37, call 3 (H100). The expert layer's first weight blocks asked of L2 by the router
# (w13pf.patch: rw_k_router_topk_prefetch, for decode steps of 9-256 tokens with bf16 experts:
# every expert's first two K blocks of its first two 128-row slices, 8 MB, issued by one thread
# a CTA before the router's launch wait, so they load while the router routes and the sort
# runs; call 1's stamps put 6.3 us from the routing's end to the w13 pass's wait and its first
# stage 7.9 us after that). The router, kernels, invariance, rollout, experts and transformers
# tests on its tree (tests_w13pf.txz), then b32 / b64 / b256 x 512 steps against main, and with four K blocks (pf4: MOE_PF_BLOCKS=4), in three
# rounds (variants.txz: main=- w13pf=w13pf.patch), then its stamps build (stamps_w13pf.txz) at
# b256 x 512.
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
gpu=$(nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader)
echo "$gpu"
s0=$SECONDS
timeout 150 tools/gpu/run-packed.sh .gpu-pack/tests_w13pf.txz \
    --only "worker_(kernels|router|invariance|rollout)_gpu|moe_experts_gpu|worker_cuda_vs_transformers_gpu" > "$R/r3_suite.txt" 2>&1
tail -8 "$R/r3_suite.txt"; grep -E "FAIL|TIMEOUT" "$R/r3_suite.txt" | head
[ -f "$R/failed.log" ] && tail -c 3000 "$R/failed.log"
echo "suite done at $((SECONDS - s0)) s"
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
OUT=$R/b256 RW_VARIANT_TIMEOUT=80 timeout 250 tools/gpu/run-variants.sh --rounds 3 main w13pf pf4 -- $C \
    decode --batches 32,64,256 --ctxs 512 --steps 10 --gen 4,300,8 --gen-reps 1 --no-quant --no-forward
python3 tools/bench/variant_lines.py "$R/b256/variants.txt" --what "decode_bf16|generate"
mv "$R/b256/variants.txt" "$R/r3_b256_variants.txt"; rm -rf "$R/b256"
echo "b256 done at $((SECONDS - s0)) s"
if [ -f .gpu-pack/stamps_w13pf.txz ]; then
    mkdir -p /tmp/rw-st && tar xJf .gpu-pack/stamps_w13pf.txz -C /tmp/rw-st
    timeout 70 /tmp/rw-st/rw-stamps $C decode --batches 256 --ctxs 512 --steps 10 --gen 1,16,2 \
        --gen-reps 1 --no-quant --no-forward > /tmp/r3_stamps_bench.jsonl 2> /tmp/r3_stamps.txt
    grep -v RW_STAMP /tmp/r3_stamps.txt | tail -3
    { echo "$gpu"; grep decode_bf16 /tmp/r3_stamps_bench.jsonl | head -3;
      python3 tools/bench/stamps.py /tmp/r3_stamps.txt --around w13 --pick 12 --before 4 --after 2; } \
        > "$R/r3_stamps_summary.txt" 2>&1
    head -40 "$R/r3_stamps_summary.txt"
fi
echo "all took $((SECONDS - s0)) s"
