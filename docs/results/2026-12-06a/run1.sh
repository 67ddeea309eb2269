#!/usr/bin/env bash
# Session 33, call 1 (H100 or H200), most needed first: the whole gpu suite on main (f6bf878,
# tests_main33.txz: the RoPE widths against main's kernel, moe_experts_gpu, the small-kernel lines
# with the backend's frequencies); the small kernels alone with the packed rw-bench; then on an
# H200 b1 x 1k alone against b1 after b256 in one engine (one round, nvidia-smi around each), on
# an H100 the b1 x 1k and b256 x 512 baselines.
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader > "$R/r1_gpu.txt"
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
s0=$SECONDS
timeout 220 tools/gpu/run-packed.sh .gpu-pack/tests_main33.txz > "$R/r1_suite.txt" 2>&1
tail -1 "$R/r1_suite.txt"; grep -E "FAIL|TIMEOUT" "$R/r1_suite.txt" | head
[ -f "$R/failed.log" ] && tail -c 3000 "$R/failed.log"
echo "suite took $((SECONDS - s0)) s"
B=/tmp/rw-packed/tools/bench/rw-bench
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
timeout 40 $B $C kernels --kernel-attention d1x1024 --expert-tokens 1 --dense-tokens 1 \
    --small-tokens 1,256,2048 > "$R/r1_small.jsonl" 2>> "$R/r1_err.txt"
python3 - "$R/r1_small.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    try:
        o = json.loads(line)
    except ValueError:
        continue
    w = o.get("what", "")
    if w.startswith(("qk_rope", "combine_rms", "hbm")) or o.get("role") == "ceiling":
        print(w, o.get("median_s"), o.get("ratio"), o.get("error", ""))
PY
echo "small done at $((SECONDS - s0)) s"
diag() { # batches
    echo "=== $1" >> "$R/r1_diag.jsonl"
    nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader >> "$R/r1_diag.jsonl"
    timeout 120 $B $C decode --batches $1 --ctxs $2 --steps 20 --gen 1,16,2 --gen-reps 1 \
        --no-quant --no-forward >> "$R/r1_diag.jsonl" 2>> "$R/r1_err.txt"
}
if [ "$mem" -gt 100000 ]; then
    diag 1 1024; diag 256,1 1024; diag 1 1024
else
    diag 1 1024; diag 256 512
fi
python3 - "$R/r1_diag.jsonl" <<'PY'
import json, sys
v = None
for line in open(sys.argv[1]):
    if line.startswith("=== "):
        v = line.split()[1:]
        continue
    try:
        o = json.loads(line)
    except ValueError:
        if line.strip(): print("   smi", line.strip())
        continue
    if o.get("what") == "decode_bf16" and o.get("median_s"):
        print(" ".join(v), o.get("batch"), round(o["ctx_mean"]), round(o["median_s"] * 1e3, 3), "ms")
PY
echo "all took $((SECONDS - s0)) s"
