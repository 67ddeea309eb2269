#!/usr/bin/env bash
# Session 32, call 1 (H100 or H200), in order of need, each later part only while time is left:
# the whole gpu suite on main (tests_main32.txz, 128d128); the rope-reg branch's kernel,
# invariance, transformers and rollout tests (tests_rreg.txz); main (base) against rope-reg
# (rreg; rreg4 with 4 warps a CTA): the small kernels alone (rw-bench kernels --small-tokens),
# then engine steps b256 and b1, alternating, with the generate line's outputs digest; Nsight
# Compute's full sections on q/k norm + RoPE + KV write of a b256 x 512 engine step (base and
# rreg; the router and combine + norm for base); the step's kernel table at b256 x 512.
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader > "$R/r1_gpu.txt"
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
s0=$SECONDS
timeout 240 tools/gpu/run-packed.sh .gpu-pack/tests_main32.txz > "$R/r1_suite.txt" 2>&1
tail -2 "$R/r1_suite.txt"
echo "suite took $((SECONDS - s0)) s"
RW_PACK_DIR=/tmp/rw-rreg timeout 60 tools/gpu/run-packed.sh .gpu-pack/tests_rreg.txz \
    --only "worker_(kernels|invariance|cuda_vs_transformers|rollout)" > "$R/r1_suite_rreg.txt" 2>&1
tail -1 "$R/r1_suite_rreg.txt"; grep -E "FAIL" "$R/r1_suite_rreg.txt" | head
mkdir -p /tmp/rv && tar xJf .gpu-pack/variants.txz -C /tmp/rv
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
for v in base rreg rreg4; do
    echo "=== $v" >> "$R/r1_small.jsonl"
    timeout 60 /tmp/rv/rw-$v $C kernels --kernel-attention d1x1024 --expert-tokens 1 --dense-tokens 1 \
        --small-tokens 1,64,256,2048 >> "$R/r1_small.jsonl" 2>> "$R/r1_err.txt"
done
python3 - "$R/r1_small.jsonl" <<'PY'
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
    if w.startswith(("qk_rope", "combine_rms", "hbm")) or o.get("role") == "ceiling":
        print(v, w, o.get("median_s"), o.get("ratio"), o.get("error", ""))
PY
echo "small done at $((SECONDS - s0)) s"
big=512; [ "$mem" -gt 100000 ] && big=1024
for round in 1 2 3; do
    for v in base rreg rreg4; do
        [ $((SECONDS - s0)) -ge 290 ] && break 2
        echo "=== $v $round" >> "$R/r1_steps.jsonl"
        timeout 60 /tmp/rv/rw-$v $C decode --batches 256 --ctxs $big --steps 10 --gen 1,16,2 --gen-reps 1 \
            --no-quant --no-forward >> "$R/r1_steps.jsonl" 2>> "$R/r1_err.txt"
        timeout 40 /tmp/rv/rw-$v $C decode --batches 1 --ctxs 1024 --steps 20 --gen 4,300,8 --gen-reps 1 \
            --no-quant --no-forward >> "$R/r1_steps.jsonl" 2>> "$R/r1_err.txt"
    done
done
python3 - "$R/r1_steps.jsonl" <<'PY'
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
if [ $((SECONDS - s0)) -lt 370 ]; then
export RW_BENCH_NCU_ENGINE=256:512
for v in base rreg; do
    re="qk_rope_kv"
    [ $v = base ] && re="qk_rope_kv|combine_rmsnorm"
    timeout 70 ncu --profile-from-start off --kernel-name-base demangled -k "regex:$re" \
        --launch-count 2 --set full --import-source no -f -o /tmp/small_$v \
        /tmp/rv/rw-$v decode --batches 256 --ctxs 512 --no-quant --gen 1,16,2 \
        --gen-reps 1 --steps 2 > /tmp/small_run_$v.log 2>&1
    ncu --import /tmp/small_$v.ncu-rep --page details > /tmp/ncu_$v.txt 2>&1
    ncu --import /tmp/small_$v.ncu-rep --page source --csv --print-source sass > /tmp/sass_$v.csv 2>&1
    python3 tools/bench/sass_table.py /tmp/sass_$v.csv > /tmp/sass_$v.txt 2>&1
done
cat /tmp/ncu_base.txt /tmp/ncu_rreg.txt > "$R/r1_ncu_small.txt"
cat /tmp/sass_base.txt /tmp/sass_rreg.txt > "$R/r1_ncu_small_sass.txt"
grep -E "^  [a-z_]+.*\(|Duration|DRAM Throughput|Achieved Occupancy|Registers Per|Waves Per" "$R/r1_ncu_small.txt" | head -48
unset RW_BENCH_NCU_ENGINE
echo "ncu done at $((SECONDS - s0)) s"
fi
if [ $((SECONDS - s0)) -lt 430 ]; then
export RW_BUILD_DIR=/tmp/rw-packed
timeout 80 tools/gpu/kernel-times.sh 256 512 > "$R/r1_ktimes.txt" 2>&1
rm -f "$R"/kernel_times_*.csv
grep -E "qk_rope|router|combine_rmsnorm|sum|total" "$R/r1_ktimes.txt" | head -30
echo "ktimes done at $((SECONDS - s0)) s"
fi
echo "all took $((SECONDS - s0)) s"
