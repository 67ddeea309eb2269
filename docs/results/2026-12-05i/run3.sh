#!/usr/bin/env bash
# Session 30, call 3 (an H200: G1's b256 x 1k does not fit 80 GB): the target rows G1 / G2 / G3
# and G6's decode points beside torch SDPA on the packed split form (tests_pk.txz, 2d91500), then
# engine steps of main (tests_main.txz, 8606db4) and pk alternating at the split shapes.
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$R/r3_gpu.txt"
tools/gpu/run-packed.sh .gpu-pack/tests_pk.txz --unpack-only > /dev/null 2>&1 || echo "unpack pk failed"
RW_PACK_DIR=/tmp/rw-old tools/gpu/run-packed.sh .gpu-pack/tests_main.txz --unpack-only > /dev/null 2>&1 || echo "unpack main failed"
B=/tmp/rw-packed/tools/bench/rw-bench
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
if [ "${mem:-0}" -ge 100000 ]; then
    timeout 170 "$B" $C decode --batches 1,256 --ctxs 1024 --steps 10 --gen 1,16,2 --gen-reps 1 \
        > "$R/r3_g123.jsonl" 2> "$R/r3_g123.err"
    timeout 60 "$B" $C kernels --kernel-attention d256x1024,d32x8192,d8x8192,d1x1024 --expert-tokens 1 \
        --dense-tokens 1 > "$R/r3_kernels.jsonl" 2> "$R/r3_kernels.err"
    timeout 60 python3 tools/peer/torch_kernels.py --kernel-attention d256x1024,d32x8192,d8x8192,d1x1024 \
        --rw "$R/r3_kernels.jsonl" > "$R/r3_peer.jsonl" 2> "$R/r3_peer.err"
    grep -h '"decode_bf16\|"decode_mxfp8\|decode_forward' "$R"/r3_g123.jsonl | python3 -c "
import json,sys
for l in sys.stdin:
    o=json.loads(l)
    print(o['what'], o.get('batch'), o.get('ctx'), round(o.get('median_s',0)*1e3,3), 'ms', o.get('ratio'), o.get('target_id'), o.get('met'))"
    grep -h '"compare"' "$R/r3_peer.jsonl" | grep attention | python3 -c "
import json,sys
for l in sys.stdin:
    o=json.loads(l); print(o['what'], o['rw_seconds'], o['peer_seconds'], o['ratio'])"
fi
end=$((SECONDS + ${BENCH_S:-230}))
for round in 1 2 3; do
    for v in old pk; do
        b=/tmp/rw-packed/tools/bench/rw-bench
        [ $v = old ] && b=/tmp/rw-old/tools/bench/rw-bench
        for bc in "1 1024 20" "1 4096 20" "8 4096 10" "8 8192 10" "32 4096 10"; do
            set -- $bc
            [ $SECONDS -ge $end ] && break 3
            echo "=== $v $round" >> "$R/r3_decode.jsonl"
            timeout 90 "$b" $C decode --batches $1 --ctxs $2 --steps $3 --gen 1,16,2 --gen-reps 1 \
                --no-quant >> "$R/r3_decode.jsonl" 2>> "$R/r3_decode.err"
        done
    done
done
python3 - "$R/r3_decode.jsonl" <<'PY'
import json, sys
v = None
for line in open(sys.argv[1]):
    if line.startswith("=== "):
        v = line.split()[1:]
        continue
    try:
        o = json.loads(line)
    except ValueError:
        continue
    if o.get("what", "").startswith(("decode_bf16", "decode_forward")) and o.get("median_s"):
        print(" ".join(v), o["what"], o.get("batch"), o.get("ctx"),
              round(o["median_s"] * 1e3, 3), "ms", o.get("ratio"), o.get("target_id"))
PY
