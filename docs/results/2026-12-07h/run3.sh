#!/usr/bin/env bash
# Forty-ninth session (main 02eab3c). b256 (b256.patch: wsp and the w13 pass's bf16 input-pair
# tiles 256 weight rows tall, two m64 blocks a warpgroup interleaved with the other's, three
# stages of 64 KB with the producer warp: each gathered token row is read for six row blocks of
# Qwen3-30B-A3B's 1536 instead of twelve) beside wsp, wspw2 and main. On an H200 the target rows
# G1 / G2 / G3 first. Then b256's GPU tests, the expert layer at 16,384 and 2048 tokens in turns,
# the 8 x 2k prefill, and as time allows wsp's expert test and run8.sh's diagnostics.
# Archives: tools/gpu/pack-variants.sh BUILD main=- wsp=... wspw2=... b256=... noA=... noB=...
#   noAB=... th32=... th96=...; tests_b256.txz and tests_wsp.txz with each patch applied.
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
s0=$SECONDS
B=${RW_CALL_BUDGET:-570}
left() { echo $((B - (SECONDS - s0))); }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$R/x_gpu.txt"
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
if [ "${mem:-0}" -ge 100000 ]; then
    mkdir -p /tmp/rw-g && tar xf .gpu-pack/variants.txz -C /tmp/rw-g
    timeout 200 /tmp/rw-g/rw-main $C decode --batches 1,256 --ctxs 1024 --steps 10 --gen 1,16,2 \
        --gen-reps 1 > "$R/x_g123.jsonl" 2> "$R/x_g123.err"
    echo "rw-bench exit $?"
    python3 tools/bench/report.py "$R/x_g123.jsonl" 2>/dev/null | grep -E '^\| G[123] '
    tail -2 "$R/x_g123.err"
    echo "target rows done at $((SECONDS - s0)) s"
fi
timeout 150 tools/gpu/run-packed.sh .gpu-pack/tests_b256.txz \
    --only 'moe|invariance|kernels_gpu|transformers' > "$R/x_tests_b256.txt" 2>&1
echo "b256 tests exit $? at $((SECONDS - s0)) s"; tail -n 10 "$R/x_tests_b256.txt"
[ -f "$R/failed.log" ] && mv "$R/failed.log" "$R/x_failed_b256.log" && tail -n 40 "$R/x_failed_b256.log"
rm -f "$R/suite.txt"
l=$(left); [ $l -gt 170 ] && l=170
RW_VARIANT_TIMEOUT=40 timeout $l tools/gpu/run-variants.sh --rounds 2 main wsp b256 wspw2 \
    -- $C kernels --kernel-attention p1x128 --expert-tokens 16384,2048 --dense-tokens 1 \
    > /dev/null 2>&1
mv "$R/variants.txt" "$R/x_kernels.txt"
python3 tools/bench/variant_lines.py "$R/x_kernels.txt" --what 'experts'
echo "kernels done at $((SECONDS - s0)) s"
l=$(left)
if [ $l -ge 80 ]; then
    [ $l -gt 110 ] && l=110
    RW_VARIANT_TIMEOUT=40 timeout $l tools/gpu/run-variants.sh --rounds 1 main wsp b256 \
        -- $C prefill --prefill-reps 2 --no-quant > /dev/null 2>&1
    mv "$R/variants.txt" "$R/x_prefill.txt"
    python3 tools/bench/variant_lines.py "$R/x_prefill.txt" --what 'prefill'
    echo "prefill done at $((SECONDS - s0)) s"
fi
l=$(left)
if [ $l -ge 70 ]; then
    timeout $((l - 5)) tools/gpu/run-packed.sh .gpu-pack/tests_wsp.txz --only 'moe_experts' \
        > "$R/x_tests_wsp.txt" 2>&1
    echo "wsp tests exit $? at $((SECONDS - s0)) s"; tail -n 3 "$R/x_tests_wsp.txt"
    [ -f "$R/failed.log" ] && mv "$R/failed.log" "$R/x_failed_wsp.log"
fi
l=$(left)
[ $l -ge 115 ] && bash docs/results/2026-12-07g/run8.sh
echo "call took $((SECONDS - s0)) s"
