#!/usr/bin/env bash
# Session 39, call 1 (an H200: G1's b256 x 1k does not fit 80 GB): the target rows G1 / G2 / G3
# and G6's decode points beside torch SDPA on main (3c06860: a8d1533's device code; tests_main.txz), the commands
# of the thirtieth session's call 3; then three b1 x 1k engine runs of 20 steps alone (the b1
# line of the target command runs after the b256 point in the same engine); then the whole gpu suite.
# The same commands as 2026-12-06e/run4.sh, which found no H200; on an H100 only the suite runs.
# The suite gets what is left of 560 s (at most 240 s).
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader > "$R/r1_gpu.txt"
tools/gpu/run-packed.sh .gpu-pack/tests_main.txz --unpack-only > /dev/null 2>&1 || echo "unpack failed"
B=/tmp/rw-packed/tools/bench/rw-bench
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
s0=$SECONDS
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
if [ "${mem:-0}" -ge 100000 ]; then
    timeout 200 "$B" $C decode --batches 1,256 --ctxs 1024 --steps 10 --gen 1,16,2 --gen-reps 1 \
        > "$R/r1_g123.jsonl" 2> /tmp/r1_g123.err
    grep -h '"decode_bf16\|"decode_mxfp8\|decode_forward' "$R"/r1_g123.jsonl | python3 -c "
import json,sys
for l in sys.stdin:
    o=json.loads(l)
    print(o['what'], o.get('batch'), o.get('ctx'), round(o.get('median_s',0)*1e3,3), 'ms', o.get('ratio'), o.get('hbm_gbps'), o.get('target_id'), o.get('met'))"
    echo "g123 done at $((SECONDS - s0)) s"
fi
timeout 60 "$B" $C kernels --kernel-attention d256x1024,d32x8192,d8x8192,d1x1024 --expert-tokens 1 \
    --dense-tokens 1 > "$R/r1_kernels.jsonl" 2> /tmp/r1_kernels.err
timeout 70 python3 tools/peer/torch_kernels.py --kernel-attention d256x1024,d32x8192,d8x8192,d1x1024 \
    --rw "$R/r1_kernels.jsonl" > "$R/r1_peer.jsonl" 2> /tmp/r1_peer.err
grep -h '"compare"' "$R/r1_peer.jsonl" | grep attention | python3 -c "
import json,sys
for l in sys.stdin:
    o=json.loads(l); print(o['what'], o['rw_seconds'], o['peer_seconds'], o['ratio'], o.get('target_id'), o.get('met'))"
echo "g6 done at $((SECONDS - s0)) s"
for i in 1 2 3; do
    timeout 60 "$B" $C decode --batches 1 --ctxs 1024 --steps 20 --gen 1,16,2 --gen-reps 1 \
        --no-quant >> "$R/r1_b1.jsonl" 2>> /tmp/r1_b1.err
done
grep -h '"decode_bf16\|decode_forward' "$R/r1_b1.jsonl" | python3 -c "
import json,sys
for l in sys.stdin:
    o=json.loads(l)
    print(o['what'], o.get('batch'), o.get('ctx'), round(o.get('median_s',0)*1e3,3), 'ms', o.get('ratio'), o.get('hbm_gbps'))"
tail -2 /tmp/r1_*.err 2>/dev/null
echo "all took $((SECONDS - s0)) s"
left=$((560 - (SECONDS - s0))); [ $left -gt 240 ] && left=240
timeout $left tools/gpu/run-packed.sh .gpu-pack/tests_main.txz > "$R/r1_suite.txt" 2>&1
tail -30 "$R/r1_suite.txt"
[ -f "$R/failed.log" ] && tail -c 3000 "$R/failed.log"
echo "suite done at $((SECONDS - s0)) s"
