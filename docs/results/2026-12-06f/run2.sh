#!/usr/bin/env bash
# Session 38, call 2. The static tile map (smap.patch; moe/static_map.cuh): decode steps of at
# least 2 assignments an expert skip the sort launch, and each w13 CTA of tile x < E streams
# expert x's first weight blocks before its launch wait, then works out its rows from the ids.
# The map's overflow tiles run after all its static tiles (SMAP_OVERFLOW_LAST; smapxy: in grid
# order). The router, kernels, invariance, rollout, experts and transformers tests on its tree
# (tests_smap.txz), then b32 / b64 / b256 x 512 steps against main in three rounds (variants.txz:
# main=to_main.patch smap=- smapxy=SMAP_OVERFLOW_LAST=0), then the stamps build of smap at
# b256 x 512. On an H200 with time left, the target rows G1-G3 on main (run1.sh's first command,
# tests_main.txz's rw-bench).
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
gpu=$(nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader)
echo "$gpu"
s0=$SECONDS
timeout 150 tools/gpu/run-packed.sh .gpu-pack/tests_smap.txz \
    --only "worker_(kernels|router|invariance|rollout)_gpu|moe_experts_gpu|worker_cuda_vs_transformers_gpu" > "$R/r2_suite.txt" 2>&1
tail -8 "$R/r2_suite.txt"; grep -E "FAIL|TIMEOUT" "$R/r2_suite.txt" | head
[ -f "$R/failed.log" ] && tail -c 3000 "$R/failed.log"
echo "suite done at $((SECONDS - s0)) s"
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
OUT=$R/b256 RW_VARIANT_TIMEOUT=80 timeout 260 tools/gpu/run-variants.sh --rounds 3 main smap smapxy -- $C \
    decode --batches 32,64,256 --ctxs 512 --steps 10 --gen 4,300,8 --gen-reps 1 --no-quant --no-forward
python3 tools/bench/variant_lines.py "$R/b256/variants.txt" --what "decode_bf16|generate"
mv "$R/b256/variants.txt" "$R/r2_b256_variants.txt"; rm -rf "$R/b256"
echo "b256 done at $((SECONDS - s0)) s"
if [ -f .gpu-pack/stamps_smap.txz ]; then
    mkdir -p /tmp/rw-st && tar xJf .gpu-pack/stamps_smap.txz -C /tmp/rw-st
    timeout 70 /tmp/rw-st/rw-stamps $C decode --batches 256 --ctxs 512 --steps 10 --gen 1,16,2 \
        --gen-reps 1 --no-quant --no-forward > /tmp/r2_stamps_bench.jsonl 2> /tmp/r2_stamps.txt
    grep -v RW_STAMP /tmp/r2_stamps.txt | tail -3
    { echo "$gpu"; grep decode_bf16 /tmp/r2_stamps_bench.jsonl | head -3;
      python3 tools/bench/stamps.py /tmp/r2_stamps.txt --around w13 --pick 12 --before 4 --after 2 \
          --split w13=100 --split w2=100; } > "$R/r2_stamps_summary.txt" 2>&1
    head -40 "$R/r2_stamps_summary.txt"
fi
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
if [ "${mem:-0}" -ge 100000 ] && [ $((SECONDS - s0)) -lt 330 ]; then
    tools/gpu/run-packed.sh .gpu-pack/tests_main.txz --unpack-only > /dev/null 2>&1 || echo "unpack failed"
    timeout 200 /tmp/rw-packed/tools/bench/rw-bench $C decode --batches 1,256 --ctxs 1024 --steps 10 \
        --gen 1,16,2 --gen-reps 1 > "$R/r2_g123.jsonl" 2> /tmp/r2_g123.err
    grep -h '"decode_bf16\|"decode_mxfp8\|decode_forward' "$R"/r2_g123.jsonl | python3 -c "
import json,sys
for l in sys.stdin:
    o=json.loads(l)
    print(o['what'], o.get('batch'), o.get('ctx'), round(o.get('median_s',0)*1e3,3), 'ms', o.get('ratio'), o.get('hbm_gbps'), o.get('target_id'), o.get('met'))"
    tail -2 /tmp/r2_g123.err
fi
echo "all took $((SECONDS - s0)) s"
