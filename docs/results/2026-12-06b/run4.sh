#!/usr/bin/env bash
# Session 34, call 4: what makes the fresh variant slower. fresh0 is the same kernel with the
# host passing fresh 0 (no copy before the wait): as fast as base, the copies before the wait
# cost; as slow as fresh, the kernel's code does. b1 at 1k and 4k, three rounds in turns; then on
# an H200 b1 x 1k alone against b1 after b256 x 1k in one engine (run1.sh's diagnosis).
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader > "$R/r4_gpu.txt"
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
s0=$SECONDS
archive() { (cd "$R" && tar czf /tmp/r4_all.tgz . && find . -type f -delete && find . -mindepth 1 -type d -delete && mv /tmp/r4_all.tgz .); }
trap 'archive; exit 143' TERM
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
if [ "${1:-}" != --diag-only ]; then # (call 6 runs the diagnosis alone)
    OUT=$R/steps RW_VARIANT_TIMEOUT=60 timeout 200 tools/gpu/run-variants.sh --rounds 3 base fresh fresh0 -- $C \
        decode --batches 1 --ctxs 1024,4096 --steps 20 --gen 4,300,8 --gen-reps 1 --no-quant --no-forward
    python3 tools/bench/variant_lines.py "$R/steps/variants.txt" --what "decode_bf16|generate" | tee "$R/r4_steps.txt"
    echo "steps done at $((SECONDS - s0)) s"
fi
B=/tmp/rw-variants/rw-base
diag() { # batches
    echo "=== $1" >> "$R/r4_diag.jsonl"
    nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader >> "$R/r4_diag.jsonl"
    timeout 120 $B $C decode --batches $1 --ctxs 1024 --steps 20 --gen 1,16,2 --gen-reps 1 \
        --no-quant --no-forward >> "$R/r4_diag.jsonl" 2>> "$R/r4_err.txt"
}
if [ "$mem" -gt 100000 ]; then
    diag 1; diag 256,1; diag 1; diag 256,1 # (b256 x 1k needs an H200's memory)
    python3 - "$R/r4_diag.jsonl" <<'PY' | tee "$R/r4_diag.txt"
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
        print(v, o.get("batch"), o.get("ctx"), round(o["ms_per_step"], 3), "ms", "model",
              round(o.get("model_ms_per_step", 0), 3), "ratio", o.get("ratio"))
PY
fi
echo "all took $((SECONDS - s0)) s"
archive
