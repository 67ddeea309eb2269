#!/usr/bin/env bash
# Forty-eighth session (run4 of 2026-12-07f, with the 8 x 2k prefill after it): main of c8b7f44. On an
# H200 the target rows G1 / G2 / G3 (decode b1 and b256 x 1k, bf16 and mxfp8-last-8), then on
# either card G6's prefill and decode shapes beside torch SDPA.
# Archive: .gpu-pack/variants.txz with rw-main built from c8b7f44
# (pack-variants.sh BUILD main=-).
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$R/d_gpu.txt"
s0=$SECONDS
B=${RW_CALL_BUDGET:-340}
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
S=p8x2048,d256x1024,d32x8192,d8x8192,d1x1024
mkdir -p /tmp/rw-variants && tar xf .gpu-pack/variants.txz -C /tmp/rw-variants
X=/tmp/rw-variants/rw-main
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
if [ "${mem:-0}" -ge 100000 ]; then
    timeout $((B - 110)) $X $C decode --batches 1,256 --ctxs 1024 \
        --steps 10 --gen 1,16,2 --gen-reps 1 > "$R/d_g123.jsonl" 2> "$R/d_g123.err"
    echo "rw-bench exit $?"
    python3 tools/bench/report.py "$R/d_g123.jsonl" 2>/dev/null | grep -E '^\| G[123] '
    tail -2 "$R/d_g123.err"
    echo "target rows done at $((SECONDS - s0)) s"
fi
left=$((B - (SECONDS - s0)))
if [ $left -ge 70 ]; then
    timeout 45 $X $C kernels --kernel-attention $S --expert-tokens 1 --dense-tokens 1 \
        > "$R/d_kernels.jsonl" 2> "$R/d_kernels.err"
    echo "kernels exit $?"
    timeout $((left - 50 > 80 ? 80 : left - 50)) python3 tools/peer/torch_kernels.py \
        --kernel-attention $S --expert-tokens 1 --rw "$R/d_kernels.jsonl" > "$R/d_peer.jsonl" 2> "$R/d_peer.err"
    echo "peer exit $?"
    grep -h '"compare"' "$R/d_peer.jsonl" | grep attention | python3 -c "
import json,sys
for l in sys.stdin:
    o=json.loads(l); print(o['what'], o['rw_seconds'], o['peer_seconds'], o['ratio'], o.get('target_id'), o.get('met'))"
fi
left=$((B - (SECONDS - s0)))
if [ $left -ge 40 ]; then
    timeout $((left - 5)) $X $C prefill --prefill-reps 2 --no-quant > "$R/d_prefill.jsonl" 2> "$R/d_prefill.err"
    echo "prefill exit $?"
    python3 tools/bench/report.py "$R/d_prefill.jsonl" 2>/dev/null | grep -E '^\| G4 '
fi
echo "all took $((SECONDS - s0)) s"
