#!/usr/bin/env bash
# Forty-ninth session (main 02eab3c; the archives of run1.sh). On an H200, first the target rows
# G1 / G2 / G3 (decode b1 and b256 x 1k, bf16 and mxfp8-last-8; last measured on that card in the
# thirtieth session), then wsp's GPU tests and main / wsp / wspw2 on the expert layer at 16,384
# and 2048 tokens (run9.sh without its prefill). On an H100, run1.sh.
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
if [ "${mem:-0}" -lt 100000 ]; then
    exec bash docs/results/2026-12-07h/run1.sh
fi
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$R/g_gpu.txt"
s0=$SECONDS
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
mkdir -p /tmp/rw-variants && tar xf .gpu-pack/variants.txz -C /tmp/rw-variants
X=/tmp/rw-variants/rw-main
timeout 220 $X $C decode --batches 1,256 --ctxs 1024 --steps 10 --gen 1,16,2 --gen-reps 1 \
    > "$R/g_g123.jsonl" 2> "$R/g_g123.err"
echo "rw-bench exit $?"
python3 tools/bench/report.py "$R/g_g123.jsonl" 2>/dev/null | grep -E '^\| G[123] '
tail -2 "$R/g_g123.err"
echo "target rows done at $((SECONDS - s0)) s"
timeout 150 tools/gpu/run-packed.sh .gpu-pack/tests_wsp.txz \
    --only 'moe|invariance|kernels_gpu|transformers' > "$R/w_tests.txt" 2>&1
echo "tests exit $? at $((SECONDS - s0)) s"; tail -n 10 "$R/w_tests.txt"
[ -f "$R/failed.log" ] && tail -n 40 "$R/failed.log"
rm -f "$R/suite.txt"
left=$((570 - (SECONDS - s0)))
RW_VARIANT_TIMEOUT=40 timeout $((left > 150 ? 150 : left)) tools/gpu/run-variants.sh --rounds 2 \
    main wsp wspw2 -- $C kernels --kernel-attention p1x128 --expert-tokens 16384,2048 \
    --dense-tokens 1 > /dev/null 2>&1
mv "$R/variants.txt" "$R/w_kernels.txt"
python3 tools/bench/variant_lines.py "$R/w_kernels.txt" --what 'experts'
echo "call took $((SECONDS - s0)) s"
