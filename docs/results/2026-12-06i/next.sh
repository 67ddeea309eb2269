#!/usr/bin/env bash
# For the next call (prepared in the forty-first session, after its device time ran out): run3.sh's
# work, with the target rows G1 / G2 / G3 first where the card is an H200 (G1 and G3's bf16
# partner at b256 x 1k do not fit 80 GB). In order:
#   1. main's GPU tests (tests_main.txz: main at 7d9ba06, the 256-byte L2 fetch)
#   2. (H200) rw-bench decode --batches 1,256 --ctxs 1024: G1, G2 and G3 (mxfp8-last-8 against
#      bf16, both at b256 x 1k) from main's rw-bench
#   3. the builds of variants.txz in turns (main a512 a1024 st4 st6: run3.sh's header; a512st4:
#      a512 with st4), two or three rounds as the budget allows, mxfp8-last-8 b256 x 1k with
#      bf16 b256 x 512 beside it
# Archives as in run3.sh's header, variants.txz with a512st4=MOE_QUANT_L2_AHEAD=512,MOE_MX_WG_STAGES=4
# added (.gpu-pack/tests_main.txz, .gpu-pack/variants.txz); rebuild
# them from main if the checkout's .gpu-pack is gone. Carry .deps and .gpu-pack;
# RW_CALL_BUDGET (seconds, default 480) bounds the script.
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$R/n_gpu.txt"
s0=$SECONDS
B=${RW_CALL_BUDGET:-480}
timeout 150 tools/gpu/run-packed.sh .gpu-pack/tests_main.txz \
    --only "moe_experts_gpu|worker_invariance_gpu|worker_cuda_vs_transformers_gpu" > "$R/n_tests.txt" 2>&1
rc=$?
tail -5 "$R/n_tests.txt"; grep -h "quantized weights" /tmp/rw-packed/logs/*.log 2>/dev/null | sort -u
echo "tests (exit $rc) done at $((SECONDS - s0)) s"
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
if [ "${mem:-0}" -ge 100000 ] && [ -x /tmp/rw-packed/tools/bench/rw-bench ]; then
    timeout 200 /tmp/rw-packed/tools/bench/rw-bench $C decode --batches 1,256 --ctxs 1024 --steps 10 \
        --gen 1,16,2 --gen-reps 1 > "$R/n_g123.jsonl" 2> "$R/n_g123.err"
    grep -h '"decode_bf16\|"decode_mxfp8\|decode_forward' "$R/n_g123.jsonl" | python3 -c "
import json,sys
for l in sys.stdin:
    o=json.loads(l)
    print(o['what'], o.get('batch'), o.get('ctx'), round(o.get('median_s',0)*1e3,3), 'ms', o.get('ratio'), o.get('hbm_gbps'), o.get('target_id'), o.get('met'))"
    tail -2 "$R/n_g123.err"
    echo "target rows done at $((SECONDS - s0)) s"
fi
VT=$((B - (SECONDS - s0) - 20)); [ $VT -gt 400 ] && VT=400
V=${RW_V:-main a512 a1024 st4 st6 a512st4}
nv=$(echo $V | wc -w)
RN=3; [ $VT -lt $((nv * 16 * 3 + 20)) ] && RN=2 # a variant-round is about 16 s on an H100
OUT=$R/v RW_VARIANT_TIMEOUT=90 timeout $VT tools/gpu/run-variants.sh --rounds $RN $V -- $C \
    decode --batches 256 --ctxs 512 --steps 10 --gen 1,16,2 --gen-reps 1 --no-forward
python3 tools/bench/variant_lines.py "$R/v/variants.txt" --what "decode_bf16|decode_mxfp8"
mv "$R/v/variants.txt" "$R/n_variants.txt"; rm -rf "$R/v"
echo "all took $((SECONDS - s0)) s"
