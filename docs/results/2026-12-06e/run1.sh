#!/usr/bin/env bash
# Session 37, call 1 (H100). (a) The router's sort in groups (gsort.patch: each routing CTA
# counts and ranks its token group's assignments, the last one places them; no sort launch for
# decode steps of 9-256 tokens): the router, kernels, invariance, rollout, experts and
# transformers tests on its tree (tests_gsort.txz), then b32 / b64 / b256 x 512 steps against
# main in two rounds. (b) The w13 pass's first commit group as stage 0 alone (s0first.patch of
# 2026-12-06d) against main and gsort: b1 / b8 steps at 1k and 4k, three rounds (variants.txz:
# main=- s0first=... gsort=...; main a8d1533). (c) The stamps build of main (stamps.txz) at
# b256 x 512: the router's end, the w13 pass's wait and first stage.
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
gpu=$(nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader)
echo "$gpu"
s0=$SECONDS
timeout 130 tools/gpu/run-packed.sh .gpu-pack/tests_gsort.txz \
    --only "worker_(kernels|router|invariance|rollout)_gpu|moe_experts_gpu|worker_cuda_vs_transformers_gpu" > "$R/r1_suite.txt" 2>&1
tail -8 "$R/r1_suite.txt"; grep -E "FAIL|TIMEOUT" "$R/r1_suite.txt" | head
[ -f "$R/failed.log" ] && tail -c 3000 "$R/failed.log"
echo "suite done at $((SECONDS - s0)) s"
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
OUT=$R/b256 RW_VARIANT_TIMEOUT=80 timeout 170 tools/gpu/run-variants.sh --rounds 2 main gsort -- $C \
    decode --batches 32,64,256 --ctxs 512 --steps 10 --gen 1,16,2 --gen-reps 1 --no-quant --no-forward
python3 tools/bench/variant_lines.py "$R/b256/variants.txt" --what "decode_bf16"
mv "$R/b256/variants.txt" "$R/r1_b256_variants.txt"; rm -rf "$R/b256"
echo "b256 done at $((SECONDS - s0)) s"
OUT=$R/steps RW_VARIANT_TIMEOUT=50 timeout 190 tools/gpu/run-variants.sh --rounds 3 main s0first gsort -- $C \
    decode --batches 8,1 --ctxs 1024,4096 --steps 20 --gen 4,300,8 --gen-reps 1 --no-quant --no-forward
python3 tools/bench/variant_lines.py "$R/steps/variants.txt" --what "decode_bf16|generate"
mv "$R/steps/variants.txt" "$R/r1_steps_variants.txt"; rm -rf "$R/steps"
echo "steps done at $((SECONDS - s0)) s"
mkdir -p /tmp/rw-st && tar xJf .gpu-pack/stamps.txz -C /tmp/rw-st
timeout 70 /tmp/rw-st/rw-stamps $C decode --batches 256 --ctxs 512 --steps 10 --gen 1,16,2 \
    --gen-reps 1 --no-quant --no-forward > /tmp/r1_stamps_bench.jsonl 2> /tmp/r1_stamps.txt
grep -v RW_STAMP /tmp/r1_stamps.txt | tail -3
{ echo "$gpu"; grep decode_bf16 /tmp/r1_stamps_bench.jsonl | head -3;
  python3 tools/bench/stamps.py /tmp/r1_stamps.txt --around w13 --pick 3 --before 4 --after 2;
  python3 tools/bench/stamps.py /tmp/r1_stamps.txt --around w13 --pick 12 --before 4 --after 2; } \
    > "$R/r1_stamps_summary.txt" 2>&1
head -60 "$R/r1_stamps_summary.txt"
echo "all took $((SECONDS - s0)) s"
