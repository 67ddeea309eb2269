#!/usr/bin/env bash
# Session 32, last call with about 250 s of device time: rope-reg's tests and its first
# measurements. The branch's kernel and invariance tests (tests_rreg.txz); main (base) against
# rope-reg (rreg): the small kernels alone (rw-bench kernels --small-tokens), then engine steps b1
# x 1k and b256 alternating with the generate line's outputs digest, while time is left.
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$R/r4_gpu.txt"
s0=$SECONDS
RW_PACK_DIR=/tmp/rw-rreg timeout 50 tools/gpu/run-packed.sh .gpu-pack/tests_rreg.txz \
    --only "worker_(kernels|invariance|bench_forward)_gpu" > "$R/r4_suite_rreg.txt" 2>&1
tail -1 "$R/r4_suite_rreg.txt"; grep -E "FAIL" "$R/r4_suite_rreg.txt" | head
mkdir -p /tmp/rv && tar xJf .gpu-pack/variants.txz -C /tmp/rv rw-base rw-rreg
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
for v in base rreg; do
    echo "=== $v" >> "$R/r4_small.jsonl"
    timeout 40 /tmp/rv/rw-$v $C kernels --kernel-attention d1x1024 --expert-tokens 1 --dense-tokens 1 \
        --small-tokens 1,256,2048 >> "$R/r4_small.jsonl" 2>> "$R/r4_err.txt"
    grep -E '"what": "(qk_rope|combine_rms)' "$R/r4_small.jsonl" | tail -6 | \
        python3 -c "import json,sys; [print('$v', o['what'], round(o['median_s']*1e6,2), 'us', o.get('ratio')) for o in map(json.loads, sys.stdin)]"
done
echo "small done at $((SECONDS - s0)) s"
big=512
[ "$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)" -gt 100000 ] && big=1024
for round in 1 2; do
    for v in base rreg; do
        echo "=== $v $round" >> "$R/r4_steps.jsonl"
        timeout 40 /tmp/rv/rw-$v $C decode --batches 1 --ctxs 1024 --steps 20 --gen 4,300,8 --gen-reps 1 \
            --no-quant --no-forward >> "$R/r4_steps.jsonl" 2>> "$R/r4_err.txt"
        timeout 50 /tmp/rv/rw-$v $C decode --batches 256 --ctxs $big --steps 10 --gen 1,16,2 --gen-reps 1 \
            --no-quant --no-forward >> "$R/r4_steps.jsonl" 2>> "$R/r4_err.txt"
        python3 -c "
import json
v = None
for line in open('$R/r4_steps.jsonl'):
    if line.startswith('=== '): v = line.split()[1:]; continue
    try: o = json.loads(line)
    except ValueError: continue
    if o.get('what') == 'decode_bf16' and o.get('median_s'): print(*v, o.get('batch'), round(o['ctx_mean']), round(o['median_s'] * 1e3, 3), 'ms')
    if o.get('what') == 'generate_bf16': print(*v, 'generate', o.get('batch'), o.get('prompt'), o.get('new'), 'digest', o.get('outputs_digest'))
" > "$R/r4_steps.txt"
    done
done
cat "$R/r4_steps.txt"
echo "all took $((SECONDS - s0)) s"
