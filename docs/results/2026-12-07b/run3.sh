#!/usr/bin/env bash
# Forty-third session, the last try (about 200 s of device time left after failed starts): the
# one most wanted measurement a card allows.
#   H200: G1 and G3 at b256 x 1k, engine lines only (rw-main of variants.txz; G3's 1.25 x bf16
#         half has not been measured since the thirtieth session, and bf16 at b256 x 1k does
#         not fit an 80 GB card)
#   H100: the stream probe at the split w13 tile's two CTAs an SM (run2.sh's probe part)
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$R/n_gpu.txt"
s0=$SECONDS
B=${RW_CALL_BUDGET:-200}
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
if [ "${mem:-0}" -ge 100000 ]; then
    mkdir -p /tmp/rw-variants && tar xf .gpu-pack/variants.txz -C /tmp/rw-variants rw-main
    timeout $((B - 10)) /tmp/rw-variants/rw-main $C decode --batches 256 --ctxs 1024 \
        --steps 10 --gen 1,16,2 --gen-reps 1 --no-forward --time-limit $((B - 30)) \
        > "$R/n_g13.jsonl" 2> "$R/n_g13.err"
    echo "rw-bench exit $?"
    python3 tools/bench/report.py "$R/n_g13.jsonl" 2>/dev/null | grep -E '^\| G[13] '
    tail -3 "$R/n_g13.err"
else
    timeout $((B - 10)) .gpu-pack/stream_probe > "$R/n_probe.jsonl" 2> "$R/n_probe.err"
    echo "probe exit $?"; cat "$R/n_probe.err"
fi
echo "all took $((SECONDS - s0)) s"
