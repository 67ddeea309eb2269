#!/usr/bin/env bash
# Session 24, call 3: the standing table's memory-floor targets again with the settled copy
# ceiling (G1, G1L, G2, G3), G6 beside torch SDPA; the gpu suite of the tree (L2 promotion off).
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
B=/tmp/rw-variants/rw-base
rm -rf /tmp/rw-variants && mkdir -p /tmp/rw-variants && tar xf .gpu-pack/variants.txz -C /tmp/rw-variants
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
timeout 200 tools/gpu/run-packed.sh .gpu-pack/tests_s24.txz > "$R/r3_suite.txt" 2>&1
tail -3 "$R/r3_suite.txt"
timeout 170 "$B" $C decode --batches 1,256 --ctxs 1024 --steps 10 --gen 1,16,2 --gen-reps 1 \
    > "$R/r3_g123.jsonl" 2> "$R/r3_g123.err"
timeout 200 "$B" $C decode --batches 8,32,64,128 --ctxs 4096,8192 --steps 10 --gen 1,16,2 \
    --gen-reps 1 --no-quant > "$R/r3_g1l.jsonl" 2> "$R/r3_g1l.err"
timeout 60 "$B" $C kernels --kernel-attention d256x1024,d32x8192,d8x8192,d1x1024 --expert-tokens 1 \
    --dense-tokens 1 > "$R/r3_kernels.jsonl" 2> "$R/r3_kernels.err"
timeout 60 python3 tools/peer/torch_kernels.py --kernel-attention d256x1024,d32x8192,d8x8192,d1x1024 \
    --rw "$R/r3_kernels.jsonl" > "$R/r3_peer.jsonl" 2> "$R/r3_peer.err"
grep -h 'hbm_copy' "$R"/r3_*.jsonl | python3 -c "
import json,sys
for l in sys.stdin:
    o=json.loads(l); print(o['bench'], o['what'], round(o.get('achieved',0)), 'settle_s', o.get('settle_s'))"
grep -h '"decode_bf16\|"decode_mxfp8\|decode_forward' "$R"/r3_g123.jsonl "$R"/r3_g1l.jsonl | python3 -c "
import json,sys
for l in sys.stdin:
    o=json.loads(l)
    print(o['what'], o.get('batch'), o.get('ctx'), round(o.get('median_s',0)*1e3,3), 'ms', o.get('ratio'), o.get('target_id'), o.get('met'))"
grep -h '"compare"' "$R/r3_peer.jsonl" | grep attention | python3 -c "
import json,sys
for l in sys.stdin:
    o=json.loads(l); print(o['what'], o['rw_seconds'], o['peer_seconds'], o['ratio'])"
