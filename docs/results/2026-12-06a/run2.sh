#!/usr/bin/env bash
# Session 33, call 2: the one-token GEMV (q/k/v, o_proj) with its whole 512-column slice in
# flight: base (main), ring8 (8 stages of 64 x 64, the slice issued before the PDL wait), bn32
# (32 rows a CTA, 2 warps, twice the CTAs, 8 stages of 4 KB). The dense lines alone at 1 and 8
# tokens, then engine steps b1 and b8 x 1k alternating (three rounds) with the generate line's
# outputs digest (the same bits show the same digest).
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$R/r2_gpu.txt"
s0=$SECONDS
mkdir -p /tmp/rv && tar xJf .gpu-pack/variants.txz -C /tmp/rv
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
V="base ring8 bn32"
for v in $V; do
    echo "=== $v" >> "$R/r2_dense.jsonl"
    timeout 40 /tmp/rv/rw-$v $C kernels --kernel-attention d1x1024 --expert-tokens 1 \
        --dense-tokens 1,8 --small-tokens 1 >> "$R/r2_dense.jsonl" 2>> "$R/r2_err.txt"
done
python3 - "$R/r2_dense.jsonl" <<'PY'
import json, sys
v = None
for line in open(sys.argv[1]):
    if line.startswith("=== "):
        v = line.split()[1]
        continue
    try:
        o = json.loads(line)
    except ValueError:
        continue
    w = o.get("what", "")
    if o.get("bench") == "kernels" and ("proj" in w or "qkv" in w or "lm_head" in w):
        print(v, w, o.get("tokens", o.get("m")), o.get("median_s"), o.get("ratio"))
PY
echo "dense done at $((SECONDS - s0)) s"
for round in 1 2 3; do
    [ $((SECONDS - s0)) -ge ${RUN2_LIMIT:-240} ] && break # whole rounds only
    for v in $V; do
        echo "=== $v $round" >> "$R/r2_steps.jsonl"
        timeout 60 /tmp/rv/rw-$v $C decode --batches ${RUN2_BATCHES:-8,1} --ctxs 1024 --steps 20 --gen 4,300,8 \
            --gen-reps 1 --no-quant --no-forward >> "$R/r2_steps.jsonl" 2>> "$R/r2_err.txt"
    done
done
python3 - "$R/r2_steps.jsonl" <<'PY' | tee "$R/r2_steps.txt"
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
    if o.get("what") == "decode_bf16" and o.get("median_s"):
        print(" ".join(v), o.get("batch"), round(o["ctx_mean"]), round(o["median_s"] * 1e3, 3), "ms")
    if o.get("what") == "generate_bf16":
        print(" ".join(v), "generate", o.get("batch"), o.get("prompt"), o.get("new"), "digest", o.get("outputs_digest"))
PY
tail -3 "$R/r2_err.txt"
echo "all took $((SECONDS - s0)) s"
