#!/usr/bin/env bash
# Session 37, call 2 (H100). The router's sort in groups again, with the cluster form kept to one
# token group (call 1's tree took it for every sorting step with E <= 128 and routed only the
# first group: its tests failed and its times do not count): the router, kernels, invariance,
# rollout, experts and transformers tests on its tree (tests_gsort.txz), then b32 / b64 / b256 x
# 512 steps against main in three rounds (variants.txz: main=- gsort=gsort.patch), then the
# stamps build of the gsort tree (stamps_gsort.txz) at b256 x 512: the gap from the routing to
# the w13 pass (main's: call 1, 6.3 us).
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
gpu=$(nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader)
echo "$gpu"
s0=$SECONDS
timeout 150 tools/gpu/run-packed.sh .gpu-pack/tests_gsort.txz \
    --only "worker_(kernels|router|invariance|rollout)_gpu|moe_experts_gpu|worker_cuda_vs_transformers_gpu" > "$R/r2_suite.txt" 2>&1
tail -8 "$R/r2_suite.txt"; grep -E "FAIL|TIMEOUT" "$R/r2_suite.txt" | head
[ -f "$R/failed.log" ] && tail -c 3000 "$R/failed.log"
echo "suite done at $((SECONDS - s0)) s"
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
OUT=$R/b256 RW_VARIANT_TIMEOUT=80 timeout 250 tools/gpu/run-variants.sh --rounds 3 main gsort -- $C \
    decode --batches 32,64,256 --ctxs 512 --steps 10 --gen 4,300,8 --gen-reps 1 --no-quant --no-forward
python3 tools/bench/variant_lines.py "$R/b256/variants.txt" --what "decode_bf16|generate"
mv "$R/b256/variants.txt" "$R/r2_b256_variants.txt"; rm -rf "$R/b256"
echo "b256 done at $((SECONDS - s0)) s"
mkdir -p /tmp/rw-st && tar xJf .gpu-pack/stamps_gsort.txz -C /tmp/rw-st
timeout 70 /tmp/rw-st/rw-stamps $C decode --batches 256 --ctxs 512 --steps 10 --gen 1,16,2 \
    --gen-reps 1 --no-quant --no-forward > /tmp/r2_stamps_bench.jsonl 2> /tmp/r2_stamps.txt
grep -v RW_STAMP /tmp/r2_stamps.txt | tail -3
{ echo "$gpu"; grep decode_bf16 /tmp/r2_stamps_bench.jsonl | head -3;
  python3 tools/bench/stamps.py /tmp/r2_stamps.txt --around w13 --pick 12 --before 4 --after 2; } \
    > "$R/r2_stamps_summary.txt" 2>&1
head -40 "$R/r2_stamps_summary.txt"
echo "all took $((SECONDS - s0)) s"
