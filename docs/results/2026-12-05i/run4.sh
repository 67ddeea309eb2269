#!/usr/bin/env bash
# Session 30, call 4 (an H200: G1L's b128 x 4k does not fit 80 GB): on the packed split form
# (tests_pk.txz, 2d91500) G6's decode points beside torch SDPA, the G1L sweep, then the whole
# gpu suite.
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$R/r4_gpu.txt"
tools/gpu/run-packed.sh .gpu-pack/tests_pk.txz --unpack-only > /dev/null 2>&1 || echo "unpack pk failed"
B=/tmp/rw-packed/tools/bench/rw-bench
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
timeout 60 "$B" $C kernels --kernel-attention d256x1024,d32x8192,d8x8192,d1x1024 --expert-tokens 1 \
    --dense-tokens 1 > "$R/r4_kernels.jsonl" 2>> "$R/r4_err.txt"
timeout 70 python3 tools/peer/torch_kernels.py --kernel-attention d256x1024,d32x8192,d8x8192,d1x1024 \
    --rw "$R/r4_kernels.jsonl" > "$R/r4_peer.jsonl" 2>> "$R/r4_err.txt"
grep -h '"compare"' "$R/r4_peer.jsonl" | grep attention | python3 -c "
import json,sys
for l in sys.stdin:
    o=json.loads(l); print(o['what'], o['rw_seconds'], o['peer_seconds'], o['ratio'], o.get('target_id'), o.get('met'))"
timeout 170 "$B" $C decode --batches 8,32,64,128 --ctxs 4096,8192 --steps 10 --gen 1,16,2 \
    --gen-reps 1 --no-quant > "$R/r4_g1l.jsonl" 2>> "$R/r4_err.txt"
grep -h '"decode_bf16' "$R/r4_g1l.jsonl" | python3 -c "
import json,sys
for l in sys.stdin:
    o=json.loads(l)
    print(o['what'], o.get('batch'), o.get('ctx'), round(o.get('median_s',0)*1e3,3), 'ms', o.get('ratio'), o.get('target_id'), o.get('met'))"
timeout 170 tools/gpu/run-packed.sh .gpu-pack/tests_pk.txz > /dev/null 2>&1
tail -1 "$R/suite.txt"
grep FAIL "$R/suite.txt"
