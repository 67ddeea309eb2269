#!/usr/bin/env bash
# Forty-first session, call 3: main with the quantized tiles' weight copies asking L2 for 256
# bytes (MOE_QUANT_L2_PF 256, call 1's pf256): its GPU tests (tests_main.txz), then in turns,
# three rounds (mxfp8-last-8 b256 x 1k, bf16 beside it; x 512 on an H100, b1,256 x 1k on an H200):
#   main   MOE_QUANT_L2_PF 256
#   a512   + one bulk L2 prefetch a row every four blocks, 256 bytes, 512 bytes ahead
#   a1024  the same, 1024 bytes ahead
#   st4    the two-warpgroup mxfp8 tiles at four stages (five in main)
#   st6    ... at six
# Prepare: tools/gpu/pack-variants.sh BUILD main=- a512=MOE_QUANT_L2_AHEAD=512 \
#   a1024=MOE_QUANT_L2_AHEAD=1024 st4=MOE_MX_WG_STAGES=4 st6=MOE_MX_WG_STAGES=6;
#   tools/gpu/pack-tests.sh BUILD .gpu-pack/tests_main.txz. Carry .deps and .gpu-pack.
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$R/n_gpu.txt"
s0=$SECONDS
B=${RW_CALL_BUDGET:-480}
timeout 150 tools/gpu/run-packed.sh .gpu-pack/tests_main.txz \
    --only "moe_experts_gpu|worker_invariance_gpu|worker_cuda_vs_transformers_gpu" > "$R/n_tests.txt" 2>&1
rc=$?
tail -6 "$R/n_tests.txt"; grep -h "quantized weights" /tmp/rw-packed/logs/*.log 2>/dev/null | sort -u
echo "tests (exit $rc) done at $((SECONDS - s0)) s"
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
if [ "${mem:-0}" -ge 100000 ]; then P="--batches 1,256 --ctxs 1024"; else P="--batches 256 --ctxs 512"; fi
VT=$((B - (SECONDS - s0) - 20)); [ $VT -gt 400 ] && VT=400
# RW_V: the variants to time (all five by default); a variant-round is about 16 s on an H100
V=${RW_V:-main a512 a1024 st4 st6}
nv=$(echo $V | wc -w)
RN=3; [ $VT -lt $((nv * 16 * 3 + 20)) ] && RN=2
OUT=$R/v RW_VARIANT_TIMEOUT=90 timeout $VT tools/gpu/run-variants.sh --rounds $RN $V -- $C \
    decode $P --steps 10 --gen 1,16,2 --gen-reps 1 --no-forward
python3 tools/bench/variant_lines.py "$R/v/variants.txt" --what "decode_bf16|decode_mxfp8"
mv "$R/v/variants.txt" "$R/n_variants.txt"; rm -rf "$R/v"
echo "all took $((SECONDS - s0)) s"
