#!/usr/bin/env bash
# Call 3: the standing table's stale rows on main + next_run2.patch (the base binary of
# variants.txz): G1 engine line, G3, G4 with the per-phase breakdown (G4 again with the mma.sync
# prefill attention, RW_ATTN_WGMMA=0, same run), the kernels beside torch (G6, G7), and the
# per-phase table beside the peers (tools/bench/phase_table.py).
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
B=/tmp/rw-variants/rw-base
[ -x "$B" ] || { mkdir -p /tmp/rw-variants && tar xf .gpu-pack/variants.txz -C /tmp/rw-variants; }
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
RW_BENCH_BREAKDOWN=1 timeout 250 "$B" $C decode,prefill --batches 1,256 --ctxs 1024 --steps 10 \
    --gen 1,16,2 --gen-reps 1 --prefill-reps 2 > "$R/r3_decode_prefill.jsonl" 2> "$R/r3_decode_prefill.err"
RW_ATTN_WGMMA=0 RW_BENCH_BREAKDOWN=1 timeout 80 "$B" $C prefill --prefill-reps 2 \
    > "$R/r3_prefill_mma.jsonl" 2> "$R/r3_prefill_mma.err"
timeout 130 "$B" $C kernels --kernel-attention d256x1024,d32x8192,d1x1024,p8x2048 \
    --dense-tokens 1,8,256,16384 > "$R/r3_kernels.jsonl" 2> "$R/r3_kernels.err"
timeout 90 python3 tools/peer/torch_kernels.py --kernel-attention d256x1024,d32x8192,d1x1024,p8x2048 \
    --rw "$R/r3_kernels.jsonl" > "$R/r3_peer.jsonl" 2> "$R/r3_peer.err"
python3 tools/bench/phase_table.py "$R/r3_decode_prefill.jsonl" "$R/r3_kernels.jsonl" "$R/r3_peer.jsonl" \
    > "$R/r3_phase_table.md" 2>&1
cat "$R/r3_phase_table.md"
grep -h '"met"' "$R/r3_decode_prefill.jsonl" "$R/r3_prefill_mma.jsonl" "$R/r3_peer.jsonl" | cut -c1-220 | head -30
