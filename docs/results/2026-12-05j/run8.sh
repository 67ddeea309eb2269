#!/usr/bin/env bash
# Session 31, call 1: o_proj merging the attention split's partials in its GEMV (no combine
# kernel). tests_mg.txz: the suite's attention (with the new o_proj-on-partials checks),
# invariance, transformers and rollout tests. variants.txz: m0 (OPROJ_MERGE_MAX 0: the combine
# kernel as before), m18 (the tree: tokens x segments <= 18), c16 (m18 with GV_MERGE_CU 16: the
# GEMV loads 16 segments' partials at a time), mall (always at <= 8 tokens);
# the archive also holds s32 and s64 (run9.sh). Packed from branch oproj-merge (at its GV_MERGE_CU commit).
# Engine steps b8, b2, b1 at 1k, 2k, 4k, two alternating rounds. Then b1 alone at 1k against
# 64-then-1 (why b1 after a larger batch in one engine reads slower), m0, two rounds.
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader > "$R/r8_gpu.txt"
s0=$SECONDS
timeout 150 tools/gpu/run-packed.sh .gpu-pack/tests_mg.txz --only "worker_(kernels|attention|invariance|cuda_vs_transformers|rollout)" > "$R/r8_suite.txt" 2>&1
tail -3 "$R/r8_suite.txt"; grep -E "FAIL|differs" "$R/r8_suite.txt" | head
echo "suite took $((SECONDS - s0)) s"
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
RW_VARIANT_TIMEOUT=90 tools/gpu/run-variants.sh --rounds 2 m0 m18 c16 mall -- \
    $C decode --batches 8,2,1 --ctxs 1024,2048,4096 --steps 20 --gen 1,16,2 --gen-reps 1 \
    --no-quant --no-forward
echo "variants done at $((SECONDS - s0)) s"
python3 tools/bench/variant_lines.py "$R/variants.txt" | grep -E "decode_bf16 " | head -40
b=/tmp/rw-variants/rw-m0
for round in 1 2; do
    for bs in 1 64,1; do
        [ $((SECONDS - s0)) -ge 500 ] && break 2
        echo "=== $bs $round" >> "$R/r8_diag.jsonl"
        nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader >> "$R/r8_diag.jsonl"
        timeout 60 "$b" $C decode --batches $bs --ctxs 1024 --steps 20 --gen 1,16,2 --gen-reps 1 \
            --no-quant --no-forward >> "$R/r8_diag.jsonl" 2>> "$R/r8_err.txt"
        nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader >> "$R/r8_diag.jsonl"
    done
done
python3 - "$R/r8_diag.jsonl" <<'PY'
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
        print(" ".join(v), o.get("batch"), o.get("ctx"), round(o["ctx_mean"]), round(o["median_s"] * 1e3, 3),
              "ms model", round(o.get("model_ms_per_step", 0), 3), "host", round(o.get("host_ms_per_step", 0), 4))
PY
echo "all took $((SECONDS - s0)) s"
