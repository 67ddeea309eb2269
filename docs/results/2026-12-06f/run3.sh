#!/usr/bin/env bash
# Session 38, call 3. The static tile map with its overflow tiles in grid order (branch smap's
# default now, call 2's smapxy) and the step's ids read 16 bytes at a time (smapvxy: SMAP_VEC=1;
# each thread's run of 8 ids at b256 was 8 four-byte loads, a warp's instruction asking L2 for 32
# sectors) against the same with 4-byte loads (smapxy: SMAP_VEC=0), with the overflow tiles last
# (smapv: SMAP_OVERFLOW_LAST=1) and main (main=to_main.patch), b64 / b256 x 512, three rounds;
# before that the router, kernels, invariance, rollout, experts and transformers tests on its
# tree (tests_smapv.txz). On an H200, the target rows G1-G3 on main after it (as in run2.sh).
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
gpu=$(nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader)
echo "$gpu"
s0=$SECONDS
timeout 150 tools/gpu/run-packed.sh .gpu-pack/tests_smapv.txz \
    --only "worker_(kernels|router|invariance|rollout)_gpu|moe_experts_gpu|worker_cuda_vs_transformers_gpu" > "$R/r3_suite.txt" 2>&1
tail -8 "$R/r3_suite.txt"; grep -E "FAIL|TIMEOUT" "$R/r3_suite.txt" | head
[ -f "$R/failed.log" ] && tail -c 3000 "$R/failed.log"
echo "suite done at $((SECONDS - s0)) s"
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
OUT=$R/b256 RW_VARIANT_TIMEOUT=80 timeout 200 tools/gpu/run-variants.sh --rounds 3 main smapxy smapvxy smapv -- $C \
    decode --batches 64,256 --ctxs 512 --steps 10 --gen 4,300,8 --gen-reps 1 --no-quant --no-forward
python3 tools/bench/variant_lines.py "$R/b256/variants.txt" --what "decode_bf16|generate"
mv "$R/b256/variants.txt" "$R/r3_b256_variants.txt"; rm -rf "$R/b256"
echo "b256 done at $((SECONDS - s0)) s"
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
if [ "${mem:-0}" -ge 100000 ] && [ $((SECONDS - s0)) -lt 330 ]; then
    tools/gpu/run-packed.sh .gpu-pack/tests_main.txz --unpack-only > /dev/null 2>&1 || echo "unpack failed"
    timeout 200 /tmp/rw-packed/tools/bench/rw-bench $C decode --batches 1,256 --ctxs 1024 --steps 10 \
        --gen 1,16,2 --gen-reps 1 > "$R/r3_g123.jsonl" 2> /tmp/r3_g123.err
    grep -h '"decode_bf16\|"decode_mxfp8\|decode_forward' "$R"/r3_g123.jsonl | python3 -c "
import json,sys
for l in sys.stdin:
    o=json.loads(l)
    print(o['what'], o.get('batch'), o.get('ctx'), round(o.get('median_s',0)*1e3,3), 'ms', o.get('ratio'), o.get('hbm_gbps'), o.get('target_id'), o.get('met'))"
    tail -2 /tmp/r3_g123.err
fi
echo "all took $((SECONDS - s0)) s"
