#!/usr/bin/env bash
# Forty-fifth session, call 6: the flattened key split as it is to land (flat: the split decode
# CTAs share out the launch's (tile, kv head, segment) items in even ranges, the old CTA count)
# against main. Its attention tests; engine decode steps in turns (3 rounds at b1 / b8 x 1k, 4k,
# 8k; 2 rounds at b16 / b32 x 4k); the attention kernels in turns; then G6's shapes beside torch
# SDPA on flat's lines.
# Archives: .gpu-pack/tests_flat.txz; .gpu-pack/variants.txz (rw-main, rw-flat).
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$R/gpu.txt"
s0=$SECONDS
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
timeout 60 tools/gpu/run-packed.sh .gpu-pack/tests_flat.txz \
    --only "worker_attention_gpu|worker_invariance_gpu|worker_invariance_high_gpu|worker_kernels_gpu|worker_cuda_vs_transformers_gpu" \
    > "$R/tests.txt" 2>&1
echo "tests exit $?"; tail -6 "$R/tests.txt"
[ -f "$R/failed.log" ] && { tail -c 3000 "$R/failed.log"; echo "tests failed"; }
run() { # name rounds args...
    local n=$1 r=$2; shift 2
    OUT=$R/v RW_VARIANT_TIMEOUT=60 timeout 150 tools/gpu/run-variants.sh --rounds "$r" main flat -- $C "$@"
    mv "$R/v/variants.txt" "$R/$n.txt"; rm -rf "$R/v"
}
run d1 3 decode --batches 1,8 --ctxs 1024,4096,8192 --steps 20 --gen 1,16,2 --gen-reps 1 \
    --no-quant --no-forward
python3 tools/bench/variant_lines.py "$R/d1.txt" --what decode
run d2 2 decode --batches 16,32 --ctxs 4096 --steps 10 --gen 1,16,2 --gen-reps 1 --no-quant \
    --no-forward
python3 tools/bench/variant_lines.py "$R/d2.txt" --what decode
echo "steps done at $((SECONDS - s0)) s"
S=d256x1024,d32x8192,d8x8192,d16x4096,d8x4096,d1x4096,d1x1024
run k 2 kernels --kernel-attention $S --expert-tokens 1 --dense-tokens 1 --small-tokens 1
python3 tools/bench/variant_lines.py "$R/k.txt" --what attention
X=/tmp/rw-variants/rw-flat
timeout 45 $X $C kernels --kernel-attention d256x1024,d32x8192,d8x8192,d1x1024 --expert-tokens 1 \
    --dense-tokens 1 > "$R/flat_kernels.jsonl" 2> "$R/flat_kernels.err"
echo "kernels exit $?"
timeout 90 python3 tools/peer/torch_kernels.py --kernel-attention d256x1024,d32x8192,d8x8192,d1x1024 \
    --expert-tokens 1 --rw "$R/flat_kernels.jsonl" > "$R/peer.jsonl" 2> "$R/peer.err"
echo "peer exit $?"
grep -h '"compare"' "$R/peer.jsonl" | grep attention | python3 -c "
import json,sys
for l in sys.stdin:
    o=json.loads(l); print(o['what'], o['rw_seconds'], o['peer_seconds'], o['ratio'], o.get('target_id'), o.get('met'))"
echo "all took $((SECONDS - s0)) s"
