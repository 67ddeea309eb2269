#!/usr/bin/env bash
# Session 37, call 1. On an H200 (memory >= 100 GB) first the target rows G1 / G2 / G3 (b256 x 1k
# needs more than 80 GB) and G6's decode points beside torch SDPA, on main a8d1533
# (tests_main.txz: the thirtieth session's call 3 commands); on an H100 that part is skipped.
# Then on either: the w13 pass's first commit group as stage 0 alone (s0first.patch of
# 2026-12-06d) against main, b1 / b8 steps at 1k and 4k in three rounds (variants.txz:
# main=- s0first=...); then the stamps build of main (stamps.txz) at b256 x 512: the router's
# end, the w13 pass's wait and first stage, to see how long memory idles between them.
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader > "$R/r1_gpu.txt"
cat "$R/r1_gpu.txt"
tools/gpu/run-packed.sh .gpu-pack/tests_main.txz --unpack-only > /dev/null 2>&1 || echo "unpack failed"
B=/tmp/rw-packed/tools/bench/rw-bench
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
s0=$SECONDS
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
if [ "${mem:-0}" -ge 100000 ]; then
    timeout 200 "$B" $C decode --batches 1,256 --ctxs 1024 --steps 10 --gen 1,16,2 --gen-reps 1 \
        > "$R/r1_g123.jsonl" 2> "$R/r1_g123.err"
    grep -h '"decode_bf16\|"decode_mxfp8\|decode_forward' "$R"/r1_g123.jsonl | python3 -c "
import json,sys
for l in sys.stdin:
    o=json.loads(l)
    print(o['what'], o.get('batch'), o.get('ctx'), round(o.get('median_s',0)*1e3,3), 'ms', o.get('ratio'), o.get('hbm_gbps'), o.get('target_id'), o.get('met'))"
    echo "g123 done at $((SECONDS - s0)) s"
    timeout 60 "$B" $C kernels --kernel-attention d256x1024,d32x8192,d8x8192,d1x1024 --expert-tokens 1 \
        --dense-tokens 1 > "$R/r1_kernels.jsonl" 2> "$R/r1_kernels.err"
    timeout 70 python3 tools/peer/torch_kernels.py --kernel-attention d256x1024,d32x8192,d8x8192,d1x1024 \
        --rw "$R/r1_kernels.jsonl" > "$R/r1_peer.jsonl" 2> "$R/r1_peer.err"
    grep -h '"compare"' "$R/r1_peer.jsonl" | grep attention | python3 -c "
import json,sys
for l in sys.stdin:
    o=json.loads(l); print(o['what'], o['rw_seconds'], o['peer_seconds'], o['ratio'], o.get('target_id'), o.get('met'))"
    echo "g6 done at $((SECONDS - s0)) s"
fi
OUT=$R/steps RW_VARIANT_TIMEOUT=60 timeout 220 tools/gpu/run-variants.sh --rounds 3 main s0first -- $C \
    decode --batches 8,1 --ctxs 1024,4096 --steps 20 --gen 4,300,8 --gen-reps 1 --no-quant --no-forward
python3 tools/bench/variant_lines.py "$R/steps/variants.txt" --what "decode_bf16|generate" | tee "$R/r1_steps.txt"
mv "$R/steps/variants.txt" "$R/r1_steps_variants.txt"; rm -rf "$R/steps"
echo "steps done at $((SECONDS - s0)) s"
mkdir -p /tmp/rw-st && tar xJf .gpu-pack/stamps.txz -C /tmp/rw-st
timeout 90 /tmp/rw-st/rw-stamps $C decode --batches 256 --ctxs 512 --steps 10 --gen 1,16,2 \
    --gen-reps 1 --no-quant --no-forward > "$R/r1_stamps_bench.jsonl" 2> /tmp/r1_stamps.txt
grep -v RW_STAMP /tmp/r1_stamps.txt | tail -3
{ python3 tools/bench/stamps.py /tmp/r1_stamps.txt --around w13 --pick 3 --before 3 --after 2;
  python3 tools/bench/stamps.py /tmp/r1_stamps.txt --around w13 --pick 10 --before 3 --after 2; } \
    > "$R/r1_stamps_summary.txt" 2>&1
head -70 "$R/r1_stamps_summary.txt"
echo "all took $((SECONDS - s0)) s"
