#!/usr/bin/env bash
# Forty-eighth session: G7's large points after this session's expert changes (the expert layer
# at 2048 and 16,384 tokens beside torch grouped_mm, same routing, same run), then what 2897316's
# grid order did to the quantized decode tiles: prev is main with that commit's kernel change
# reverted (prev.patch); b256 x 512 bf16 steps and mxfp8-last-8 steps at the G1 point (256 x 1k;
# fits an H100), in turns.
# Archive: tools/gpu/pack-variants.sh BUILD main=- prev=prev.patch (main of c8b7f44)
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$R/f_gpu.txt"
s0=$SECONDS
B=${RW_CALL_BUDGET:-300}
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
mkdir -p /tmp/rw-variants && tar xf .gpu-pack/variants.txz -C /tmp/rw-variants
timeout 60 /tmp/rw-variants/rw-main $C kernels --kernel-attention p1x128 --expert-tokens 2048,16384 \
    --dense-tokens 1 > "$R/f_kernels.jsonl" 2> "$R/f_kernels.err"
echo "kernels exit $?"
timeout 90 python3 tools/peer/torch_kernels.py --kernel-attention p1x128 --expert-tokens 2048,16384 \
    --rw "$R/f_kernels.jsonl" > "$R/f_peer.jsonl" 2> "$R/f_peer.err"
echo "peer exit $?"
grep -h '"compare"' "$R/f_peer.jsonl" | grep experts | python3 -c "
import json,sys
for l in sys.stdin:
    o=json.loads(l); print(o['what'], o['rw_seconds'], o['peer_seconds'], o['ratio'], o.get('target_id'), o.get('met'))"
echo "G7 at $((SECONDS - s0)) s"
RW_VARIANT_TIMEOUT=110 timeout $((B - 10 - (SECONDS - s0))) tools/gpu/run-variants.sh --rounds 2 main prev -- $C \
    decode --batches 256 --ctxs 512 --steps 10 --gen 1,16,2 --gen-reps 1 --no-forward \
    > /dev/null 2>&1
mv "$R/variants.txt" "$R/f_decode.txt"
python3 tools/bench/variant_lines.py "$R/f_decode.txt" --what "decode_bf16|decode_mxfp8"
echo "all took $((SECONDS - s0)) s"
