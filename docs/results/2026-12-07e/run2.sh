#!/usr/bin/env bash
# Forty-sixth session, call 2 (after run1.sh, on the same H200): the per-phase table of decode
# b1 / b256 x 1k and prefill 8 x 2k beside the peers (tools/bench/phase_table.py), with G4's
# line, and the kernels beside torch for G6 prefill and G7. main of f11813e.
# Archive: .gpu-pack/variants.txz with rw-main built from f11813e.
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$R/p_gpu.txt"
s0=$SECONDS
X=/tmp/rw-variants/rw-main
[ -x "$X" ] || { mkdir -p /tmp/rw-variants && tar xf .gpu-pack/variants.txz -C /tmp/rw-variants; }
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
A=d256x1024,d1x1024,p8x2048
RW_BENCH_BREAKDOWN=1 timeout 260 $X $C decode,prefill --batches 1,256 --ctxs 1024 --steps 10 \
    --gen 1,16,2 --gen-reps 1 --prefill-reps 2 --no-quant > "$R/p_phase.jsonl" 2> "$R/p_phase.err"
echo "decode,prefill exit $? at $((SECONDS - s0)) s"
timeout 110 $X $C kernels --kernel-attention $A --expert-tokens 1,256,2048,16384 \
    --dense-tokens 1,8,256,16384 > "$R/p_kernels.jsonl" 2> "$R/p_kernels.err"
echo "kernels exit $? at $((SECONDS - s0)) s"
timeout 120 python3 tools/peer/torch_kernels.py --kernel-attention $A \
    --expert-tokens 1,256,2048,16384 --rw "$R/p_kernels.jsonl" > "$R/p_peer.jsonl" 2> "$R/p_peer.err"
echo "peer exit $? at $((SECONDS - s0)) s"
python3 tools/bench/phase_table.py "$R/p_phase.jsonl" "$R/p_kernels.jsonl" "$R/p_peer.jsonl" \
    > "$R/p_phase_table.md" 2>&1
cat "$R/p_phase_table.md"
python3 tools/bench/report.py "$R/p_phase.jsonl" 2>/dev/null | grep -E '^\| G[1234] '
grep -h '"compare"' "$R/p_peer.jsonl" | python3 -c "
import json,sys
for l in sys.stdin:
    o=json.loads(l); print(o['what'], o['rw_seconds'], o['peer_seconds'], o['ratio'], o.get('target_id'), o.get('met'))"
echo "all took $((SECONDS - s0)) s"
