#!/usr/bin/env bash
# Session 35, call 2: the GEMV's slice sum in push form (gvpush.patch: each slice stores its
# partials into the CTA that sums them, one cluster barrier, local sums) beside main and call 1's
# gvred (remote loads first). Tests of the push form first (tests_gvpush.txz, branch gemv-push),
# then dense lines, b8/b1 steps at 1k and 4k in four rounds, and the timer stamps of main's
# form (stamps) and the push form (pstamps). Archive: pack-variants base=- gvred=gvred.patch
# gvpush=gvpush.patch stamps=gvstamps.patch pstamps=gvpush_stamps.patch.
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader > "$R/r2_gpu.txt"
s0=$SECONDS
archive() { (cd "$R" && tar czf /tmp/r2_all.tgz . && find . -type f -delete && find . -mindepth 1 -type d -delete && mv /tmp/r2_all.tgz .); }
trap 'archive; exit 143' TERM
timeout 200 tools/gpu/run-packed.sh .gpu-pack/tests_gvpush.txz \
    --only "worker_(gemm|invariance|rollout|kernels)_gpu|worker_cuda_vs_transformers_gpu" > "$R/r2_suite.txt" 2>&1
tail -4 "$R/r2_suite.txt"; grep -E "FAIL|TIMEOUT" "$R/r2_suite.txt" | head
[ -f "$R/failed.log" ] && tail -c 2000 "$R/failed.log"
echo "suite done at $((SECONDS - s0)) s"
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
V="base gvred gvpush"
OUT=$R/dense RW_VARIANT_TIMEOUT=40 timeout 80 tools/gpu/run-variants.sh --rounds 2 $V -- $C \
    kernels --kernel-attention d1x1024 --expert-tokens 1 --dense-tokens 1,8 --small-tokens 1
python3 tools/bench/variant_lines.py "$R/dense/variants.txt" --what "proj|qkv" | tee "$R/r2_dense.txt"
OUT=$R/steps RW_VARIANT_TIMEOUT=60 timeout 250 tools/gpu/run-variants.sh --rounds 4 $V -- $C \
    decode --batches 8,1 --ctxs 1024,4096 --steps 20 --gen 4,300,8 --gen-reps 1 --no-quant --no-forward
python3 tools/bench/variant_lines.py "$R/steps/variants.txt" --what "decode_bf16|generate" | tee "$R/r2_steps.txt"
echo "steps done at $((SECONDS - s0)) s"
sed -n '/^python3 - /,/^PY$/p' docs/results/2026-12-06b/run10.sh | sed '1d;$d' > /tmp/st.py
for v in stamps pstamps; do
    timeout 60 /tmp/rw-variants/rw-$v $C decode --batches 1 --ctxs 1024 --steps 20 --gen 1,16,2 \
        --gen-reps 1 --no-quant --no-forward 2>&1 | grep GVDBG > "$R/r2_stamps_$v.txt"
    echo "== $v" | tee -a "$R/r2_stamps_summary.txt"
    python3 /tmp/st.py "$R/r2_stamps_$v.txt" | tee -a "$R/r2_stamps_summary.txt"
done
echo "all took $((SECONDS - s0)) s"
archive
