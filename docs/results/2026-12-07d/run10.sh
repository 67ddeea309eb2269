#!/usr/bin/env bash
# Forty-fifth session, call 10: the combine's ready counters (ready: each combine CTA merges its
# (token, head) as soon as the split CTAs of its tile have counted themselves done, instead of
# after the whole split) against main. Its attention tests, then the attention kernels and engine
# decode steps in turns, 2 rounds, G6's shapes beside torch SDPA on ready's lines, and the whole
# GPU suite if time is left.
# Archives: .gpu-pack/tests_ready.txz; .gpu-pack/variants.txz (rw-main, rw-ready).
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$R/gpu.txt"
s0=$SECONDS
B=${RW_CALL_BUDGET:-400}
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
timeout 60 tools/gpu/run-packed.sh .gpu-pack/tests_ready.txz \
    --only "worker_attention_gpu|worker_invariance_gpu|worker_invariance_high_gpu|worker_kernels_gpu|worker_cuda_vs_transformers_gpu" \
    > "$R/tests.txt" 2>&1
rc=$?
echo "tests exit $rc"; tail -6 "$R/tests.txt"
[ -f "$R/failed.log" ] && { tail -c 3000 "$R/failed.log"; echo "tests failed"; }
[ $rc -eq 0 ] || exit 1
run() { # name rounds args...
    local n=$1 r=$2; shift 2
    OUT=$R/v RW_VARIANT_TIMEOUT=60 timeout 150 tools/gpu/run-variants.sh --rounds "$r" main ready -- $C "$@"
    mv "$R/v/variants.txt" "$R/$n.txt"; rm -rf "$R/v"
}
run k 2 kernels --kernel-attention d32x8192,d8x8192,d16x4096,d8x4096,d1x4096,d1x1024 \
    --expert-tokens 1 --dense-tokens 1 --small-tokens 1
python3 tools/bench/variant_lines.py "$R/k.txt" --what attention
run d1 2 decode --batches 1,8 --ctxs 1024,8192 --steps 20 --gen 1,16,2 --gen-reps 1 \
    --no-quant --no-forward
python3 tools/bench/variant_lines.py "$R/d1.txt" --what decode
run d2 2 decode --batches 32 --ctxs 4096 --steps 10 --gen 1,16,2 --gen-reps 1 --no-quant \
    --no-forward
python3 tools/bench/variant_lines.py "$R/d2.txt" --what decode
echo "steps done at $((SECONDS - s0)) s"
X=/tmp/rw-variants/rw-ready
timeout 45 $X $C kernels --kernel-attention d256x1024,d32x8192,d8x8192,d1x1024 --expert-tokens 1 \
    --dense-tokens 1 > "$R/ready_kernels.jsonl" 2> "$R/ready_kernels.err"
echo "kernels exit $?"
timeout 90 python3 tools/peer/torch_kernels.py --kernel-attention d256x1024,d32x8192,d8x8192,d1x1024 \
    --expert-tokens 1 --rw "$R/ready_kernels.jsonl" > "$R/peer.jsonl" 2> "$R/peer.err"
echo "peer exit $?"
grep -h '"compare"' "$R/peer.jsonl" | grep attention | python3 -c "
import json,sys
for l in sys.stdin:
    o=json.loads(l); print(o['what'], o['rw_seconds'], o['peer_seconds'], o['ratio'], o.get('target_id'), o.get('met'))"
left=$((B - (SECONDS - s0)))
if [ $left -ge 90 ]; then
    timeout $((left - 5)) tools/gpu/run-packed.sh .gpu-pack/tests_ready.txz > "$R/suite.txt" 2>&1
    echo "suite exit $?"; tail -2 "$R/suite.txt"
fi
echo "all took $((SECONDS - s0)) s"
