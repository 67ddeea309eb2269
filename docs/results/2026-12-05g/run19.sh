#!/usr/bin/env bash
# Session 28, a later call. On an H200 (b64 and b128 x 4k fit beside the weights): run17, G1L's
# b32 / b64 / b128 x 4k before (033472e) and after (a3e9110 = main's rule) the 64-token tile rule.
# On an 80 GB GPU: q/k/v and o_proj on the 64 x 64 and 128 x 64 wgmma tiles forced in turn
# (the sweep build of variants_sweep.txz, RW_GEMM_TILE) at 16-128 tokens, 20 repetitions, two
# alternating rounds: is q/k/v's 12.3 us on 64 x 64 at exactly 64 tokens (against 22-27 at 16 /
# 32 in the 5-repetition sweep) real, and where does 64 x 64 lead?
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$R/r19_gpu.txt"
if [ "${mem:-0}" -ge 100000 ]; then
    BENCH_S=${BENCH_S:-420} bash .gpu-pack/run17.sh
    exit
fi
d=/tmp/rw-sweep
rm -rf "$d" && mkdir -p "$d" && tar xf .gpu-pack/variants_sweep.txz -C "$d"
args=(--config "$(pwd)/tools/configs/qwen3-30b-a3b.json" kernels --kernel-attention d1x1024
      --expert-tokens 1 --dense-tokens 16,24,32,48,64,80,100,128 --reps 20)
for round in 1 2; do
    for t in 64,64 128,64; do
        echo "=== $t $round" >> "$R/r19_sweep.txt"
        RW_GEMM_TILE="$t,1" timeout 60 "$d/rw-sweep" "${args[@]}" 2>&1 | grep '"dense_' >> "$R/r19_sweep.txt"
    done
done
python3 - "$R/r19_sweep.txt" <<'PY'
import json, sys, collections
t = collections.defaultdict(lambda: collections.defaultdict(list))
v = None
for line in open(sys.argv[1]):
    if line.startswith("=== "):
        v = line.split()[1]
        continue
    try:
        j = json.loads(line)
    except ValueError:
        continue
    if "median_s" in j and not j["what"].startswith("dense_lm_head"):
        t[j["what"]][v].append(j["median_s"] * 1e6)
for w in sorted(t, key=lambda w: (w.split("_m")[0], int(w.split("_m")[1]))):
    print(w, " ".join("%s %s" % (k, "/".join("%.1f" % x for x in t[w][k])) for k in sorted(t[w])))
PY

# The expert GEMMs of a b256 x 512 engine step under Nsight Compute's sections (main's tree,
# tests_s27b): the first layer's gate/up and down launches, what bounds them at 0.93 and 0.86
# of the copy rate (r18).
tools/gpu/run-packed.sh .gpu-pack/tests_s27b.txz --unpack-only > /dev/null 2>&1
for skip in 0 1; do
    RW_BENCH_NCU_ENGINE=256:512 timeout 150 ncu --profile-from-start off -k regex:moe_gemm_kernel \
        --launch-skip $skip --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis \
        --section Occupancy --section WarpStateStats --section LaunchStats --section SchedulerStats \
        /tmp/rw-packed/tools/bench/rw-bench --config "$(pwd)/tools/configs/qwen3-30b-a3b.json" \
        decode --batches 256 --ctxs 512 --no-quant --gen 1,16,2 --gen-reps 1 --steps 3 \
        > "$R/r19_ncu_moe_skip$skip.txt" 2>&1
    grep -E "moe_gemm_kernel|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Stall|Eligible|Issued Warp|L2 Hit|Theoretical Occ|Block Limit" "$R/r19_ncu_moe_skip$skip.txt" | head -30
done
