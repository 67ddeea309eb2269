#!/usr/bin/env bash
# Forty-second session, call 4 (an H200 asked for: bf16 at b256 x 1k does not fit 80 GB): the
# target rows G1, G2 and G3 from main's rw-bench (variants.txz's rw-main: main at 36e736f with
# the MOE_MX_WG_MINB knob at 1, the same kernels), as the target command runs them:
#   rw-bench decode --batches 1,256 --ctxs 1024 --steps 10 (engine and forward lines, bf16 and
#   mxfp8-last-8)
# then, with the time left, Nsight Compute of main's mxfp8 w13 tile on the H200 (its profile so
# far is an H100's, where the bytes come a third slower for the same clocks)
# run3.sh was not run: the forty-first session's profile of main's w13 tile (its SPLIT form, the
# one the engine runs) shows shared memory, not registers, holding it to two CTAs an SM, so
# occ4's and inflight3's register bounds would not add a CTA (occ4 is st4, measured level, with
# fewer registers).
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$R/n_gpu.txt"
s0=$SECONDS
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
[ "${mem:-0}" -ge 100000 ] || { echo "not an H200: the b256 x 1k bf16 line does not fit"; exit 3; }
mkdir -p /tmp/rw-variants && tar xf .gpu-pack/variants.txz -C /tmp/rw-variants
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
timeout ${RW_CALL_BUDGET:-300} /tmp/rw-variants/rw-main $C decode --batches 1,256 --ctxs 1024 \
    --steps 10 --gen 1,16,2 --gen-reps 1 > "$R/n_g123.jsonl" 2> "$R/n_g123.err"
echo "rw-bench exit $?"
python3 tools/bench/report.py "$R/n_g123.jsonl" 2>/dev/null | grep -E '^\| G[123] '
tail -3 "$R/n_g123.err"
left=$((${RW_CALL_BUDGET:-300} + 20 - (SECONDS - s0)))
if [ $left -ge 70 ]; then
    mkdir -p /tmp/pb/tools/bench && cp /tmp/rw-variants/rw-main /tmp/pb/tools/bench/rw-bench
    OUT=$R/p RW_BUILD_DIR=/tmp/pb timeout $((left - 10)) tools/gpu/kernel-profile.sh --quant --count 1 \
        'moe_gemm_kernel<.int.32, .int.1, .bool.1, .bool.1' > "$R/n_profile_log.txt" 2>&1
    cp "$R/p/profile.txt" "$R/n_profile_main.txt" 2>/dev/null
    cp "$R/p/profile_sass.txt" "$R/n_profile_sass_main.txt" 2>/dev/null
    rm -rf "$R/p"
    grep -E "Duration|DRAM Throughput|Issue Slots Busy|Eligible Warps|L2 Hit|SM Frequency" "$R/n_profile_main.txt" | head
    tail -3 "$R/n_profile_log.txt"
fi
echo "all took $((SECONDS - s0)) s"
