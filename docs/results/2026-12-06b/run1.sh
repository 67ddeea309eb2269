#!/usr/bin/env bash
# Session 34, call 1 (H100 or H200): the one-token GEMV's ring at 3 and 2 stages against main's 4
# (variants.txz: base, r3 = GV_RING=3, r2 = GV_RING=2): the dense lines alone at 1 and 8 tokens,
# then b8 and b1 x 1k engine steps with a 4 x 300 + 8 generate's outputs digest, three rounds in
# turns. On an H200 then b1 x 1k alone against b1 after b256 in one engine. One archive back.
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader > "$R/r1_gpu.txt"
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
s0=$SECONDS
archive() { (cd "$R" && tar czf /tmp/r1_all.tgz . && find . -type f -delete && find . -mindepth 1 -type d -delete && mv /tmp/r1_all.tgz .); }
trap 'archive; exit 143' TERM
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
V="base r3 r2"
OUT=$R/dense RW_VARIANT_TIMEOUT=40 timeout 100 tools/gpu/run-variants.sh --rounds 1 $V -- $C \
    kernels --kernel-attention d1x1024 --expert-tokens 1 --dense-tokens 1,8 --small-tokens 1
python3 tools/bench/variant_lines.py "$R/dense/variants.txt" --what "proj|qkv" | tee "$R/r1_dense.txt"
echo "dense done at $((SECONDS - s0)) s"
OUT=$R/steps RW_VARIANT_TIMEOUT=60 timeout 230 tools/gpu/run-variants.sh --rounds 3 $V -- $C \
    decode --batches 8,1 --ctxs 1024 --steps 20 --gen 4,300,8 --gen-reps 1 --no-quant --no-forward
python3 tools/bench/variant_lines.py "$R/steps/variants.txt" --what "decode_bf16|generate" | tee "$R/r1_steps.txt"
echo "steps done at $((SECONDS - s0)) s"
B=/tmp/rw-variants/rw-base
diag() { # batches
    echo "=== $1" >> "$R/r1_diag.jsonl"
    nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader >> "$R/r1_diag.jsonl"
    timeout 120 $B $C decode --batches $1 --ctxs 1024 --steps 20 --gen 1,16,2 --gen-reps 1 \
        --no-quant --no-forward >> "$R/r1_diag.jsonl" 2>> "$R/r1_err.txt"
}
if [ "$mem" -gt 100000 ] && [ $((SECONDS - s0)) -lt 330 ]; then
    diag 1; diag 256,1; diag 1
    python3 - "$R/r1_diag.jsonl" <<'PY' | tee "$R/r1_diag.txt"
import json, sys
v = None
for line in open(sys.argv[1]):
    if line.startswith("=== "):
        v = line.split()[1]
        continue
    try:
        o = json.loads(line)
    except ValueError:
        if line.strip(): print("   smi", line.strip())
        continue
    if o.get("what") == "decode_bf16" and o.get("ms_per_step"):
        print(v, o.get("batch"), o.get("ctx"), o["ms_per_step"], "ms", o.get("ratio"))
PY
fi
echo "all took $((SECONDS - s0)) s"
archive
