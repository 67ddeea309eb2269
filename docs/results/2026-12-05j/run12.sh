#!/usr/bin/env bash
# Session 31, call 5 (H200: b256 x 1k does not fit an H100): b1 x 1k alone against b1 after b256
# in one engine (the thirtieth session's target command read the latter 5% slower), and after
# b64, main's rw-bench, two rounds; nvidia-smi's clock, temperature and power around each run.
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$R/r12_gpu.txt"
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
mkdir -p /tmp/rv && tar xJf .gpu-pack/variants.txz -C /tmp/rv
b=/tmp/rv/rw-base
for r in 1 2; do
    for bs in 1 256,1 64,1; do
        echo "=== $bs $r" >> "$R/r12_diag.jsonl"
        nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader >> "$R/r12_diag.jsonl"
        timeout 120 "$b" $C decode --batches $bs --ctxs 1024 --steps 20 --gen 1,16,2 --gen-reps 1 \
            --no-quant --no-forward >> "$R/r12_diag.jsonl" 2>> "$R/r12_err.txt"
        nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader >> "$R/r12_diag.jsonl"
    done
done
python3 - "$R/r12_diag.jsonl" <<'PY'
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
        print(" ".join(v), o.get("batch"), round(o["ctx_mean"]), round(o["median_s"] * 1e3, 3),
              "ms model", round(o.get("model_ms_per_step", 0), 3))
PY
