#!/usr/bin/env bash
# Session 29, call 3. On an H200: the standing table's memory-floor targets on main (e4e3868,
# tests_main.txz): G1 / G2 / G3 (b1 and b256 x 1k, bf16 and mxfp8-last-8), G1L (b8-128 x 4k, 8k),
# G6's decode points beside torch SDPA; then the b256 x 1k decode attention under Nsight
# Compute's sections. On an 80 GB GPU: that attention profile at b256 x 512 (1k does not fit).
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$R/r3_gpu.txt"
[ -x /tmp/rw-packed/tools/bench/rw-bench ] && [ "$(cat /tmp/rw-packed/.pack 2>/dev/null)" = main ] ||
    { tools/gpu/run-packed.sh .gpu-pack/tests_main.txz --unpack-only > /dev/null 2>&1; echo main > /tmp/rw-packed/.pack; }
B=/tmp/rw-packed/tools/bench/rw-bench
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
ctx=512
if [ "${mem:-0}" -ge 100000 ]; then
    ctx=1024
    timeout 170 "$B" $C decode --batches 1,256 --ctxs 1024 --steps 10 --gen 1,16,2 --gen-reps 1 \
        > "$R/r3_g123.jsonl" 2> "$R/r3_g123.err"
    timeout 200 "$B" $C decode --batches 8,32,64,128 --ctxs 4096,8192 --steps 10 --gen 1,16,2 \
        --gen-reps 1 --no-quant > "$R/r3_g1l.jsonl" 2> "$R/r3_g1l.err"
    timeout 60 "$B" $C kernels --kernel-attention d256x1024,d32x8192,d8x8192,d1x1024 --expert-tokens 1 \
        --dense-tokens 1 > "$R/r3_kernels.jsonl" 2> "$R/r3_kernels.err"
    timeout 60 python3 tools/peer/torch_kernels.py --kernel-attention d256x1024,d32x8192,d8x8192,d1x1024 \
        --rw "$R/r3_kernels.jsonl" > "$R/r3_peer.jsonl" 2> "$R/r3_peer.err"
    grep -h 'hbm_copy' "$R"/r3_*.jsonl | python3 -c "
import json,sys
for l in sys.stdin:
    o=json.loads(l); print(o['bench'], o['what'], round(o.get('achieved',0)), 'settle_s', o.get('settle_s'))"
    grep -h '"decode_bf16\|"decode_mxfp8\|decode_forward' "$R"/r3_g123.jsonl "$R"/r3_g1l.jsonl | python3 -c "
import json,sys
for l in sys.stdin:
    o=json.loads(l)
    print(o['what'], o.get('batch'), o.get('ctx'), round(o.get('median_s',0)*1e3,3), 'ms', o.get('ratio'), o.get('target_id'), o.get('met'))"
    grep -h '"compare"' "$R/r3_peer.jsonl" | grep attention | python3 -c "
import json,sys
for l in sys.stdin:
    o=json.loads(l); print(o['what'], o['rw_seconds'], o['peer_seconds'], o['ratio'])"
fi
RW_BENCH_NCU_ENGINE=256:$ctx timeout 150 ncu --profile-from-start off -k regex:atc_decode_kernel \
    --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis \
    --section Occupancy --section WarpStateStats --section LaunchStats --section SchedulerStats \
    --section SourceCounters --section ComputeWorkloadAnalysis \
    "$B" $C decode --batches 256 --ctxs $ctx --no-quant --gen 1,16,2 --gen-reps 1 --steps 3 \
    > "$R/r3_ncu_attn_b256.txt" 2>&1
grep -E "atc_decode|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Eligible|Issued Warp|No Eligible|L2 Hit|L1/TEX Hit|Theoretical Occ|Block Limit|Stall|Executed Ipc" "$R/r3_ncu_attn_b256.txt" | head -40
