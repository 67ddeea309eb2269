#!/usr/bin/env bash
# Forty-fourth session, call 1. On an H200 first the target rows G1 / G2 / G3 (main; not measured
# on one since the thirtieth session). Then, on either card, the key split's partials kept in L2
# (RW_ATTN_L2, worker/kernels/attention_tile.cuh) in turns: main (0), disc (1: the combine drops
# each partial o line it has read, so none is written back), ef (2: also the split kernels' K / V
# copies evict_first), el (3: also the partial stores evict_last); `rw-bench kernels` at G6's
# decode shapes, then torch SDPA on the same shapes (the peer's times, for each variant's ratio).
# Then the attention, invariance and CUDA-vs-transformers GPU tests of the level-3 build (every
# hint and the discard), then the stream probe with what is left.
# Archives (.gpu-pack): variants.txz (rw-main, rw-disc, rw-ef, rw-el), tests_l2.txz, stream_probe.
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$R/c_gpu.txt"
s0=$SECONDS
B=${RW_CALL_BUDGET:-520}
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
S=d32x8192,d8x8192,d8x4096,d1x1024
mkdir -p /tmp/rw-variants && tar xf .gpu-pack/variants.txz -C /tmp/rw-variants
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
if [ "${mem:-0}" -ge 100000 ]; then
    timeout 220 /tmp/rw-variants/rw-main $C decode --batches 1,256 --ctxs 1024 \
        --steps 10 --gen 1,16,2 --gen-reps 1 > "$R/c_g123.jsonl" 2> "$R/c_g123.err"
    echo "rw-bench exit $?"
    python3 tools/bench/report.py "$R/c_g123.jsonl" 2>/dev/null | grep -E '^\| G[123] '
    tail -2 "$R/c_g123.err"
    echo "target rows done at $((SECONDS - s0)) s"
fi
VT=$((B - (SECONDS - s0) - 200)); [ $VT -gt 240 ] && VT=240
if [ $VT -ge 60 ]; then
    OUT=$R/v RW_VARIANT_TIMEOUT=45 timeout $VT tools/gpu/run-variants.sh --rounds 3 \
        main disc ef el -- $C kernels --kernel-attention $S --expert-tokens 1 --dense-tokens 1
    python3 tools/bench/variant_lines.py "$R/v/variants.txt" --what "attention"
    mv "$R/v/variants.txt" "$R/c_attn_variants.txt"; rm -rf "$R/v"
    # the peer on main's last lines (its G6 ratios); the variants' ratios follow from its times
    awk '/^=== /{keep = ($2 == "main")} keep && /^\{/' "$R/c_attn_variants.txt" | tail -n 20 \
        > "$R/c_main_kernels.jsonl"
    timeout 80 python3 tools/peer/torch_kernels.py --kernel-attention $S --expert-tokens 1 \
        --rw "$R/c_main_kernels.jsonl" > "$R/c_peer.jsonl" 2> "$R/c_peer.err"
    echo "peer exit $?"
    grep -h '"compare"' "$R/c_peer.jsonl" | grep attention | python3 -c "
import json,sys
for l in sys.stdin:
    o=json.loads(l); print(o['what'], o['rw_seconds'], o['peer_seconds'], o['ratio'], o.get('target_id'), o.get('met'))"
    echo "attention variants and peer done at $((SECONDS - s0)) s"
fi
left=$((B - (SECONDS - s0)))
if [ $left -ge 130 ]; then
    timeout $((left - 20 > 200 ? 200 : left - 20)) tools/gpu/run-packed.sh .gpu-pack/tests_l2.txz \
        --only "worker_attention_gpu|worker_invariance_gpu|worker_cuda_vs_transformers_gpu" \
        > "$R/c_tests.txt" 2>&1
    echo "tests exit $?"; tail -6 "$R/c_tests.txt"
    [ -f "$R/failed.log" ] && { tail -c 3000 "$R/failed.log"; echo "tests failed"; }
    echo "tests done at $((SECONDS - s0)) s"
fi
left=$((B - (SECONDS - s0)))
if [ $left -ge 80 ]; then
    timeout 60 .gpu-pack/stream_probe > "$R/c_probe.jsonl" 2> "$R/c_probe.err"; echo "probe exit $?"
    cat "$R/c_probe.err"
fi
echo "all took $((SECONDS - s0)) s"
