#!/usr/bin/env bash
# Forty-ninth session (main 02eab3c). Against main, on the expert layer at 16,384 and 2048 tokens
# in turns and the 8 x 2k prefill:
#   wsp     ../2026-12-07g/wsp.patch: a producer warp for the pipelined 128-token bf16 tiles
#   b256    b256.patch: wsp, and the w13 input-pair tiles 256 weight rows tall (two m64 blocks a
#           warpgroup, interleaved with the other's; three stages of 64 KB), so each gathered
#           token row is read for 6 row blocks of Qwen3-30B-A3B's 1536 rows instead of 12
#   ystage  ystage.patch: the w2 pass's outputs staged in shared memory and written a token row
#           at a time in whole lines (Nsight Compute: its stores used 8 of each sector's 32 bytes)
#   b256y   both
# On an H200 the target rows G1 / G2 / G3 come first. b256y's GPU tests, ystage's expert test.
# Archives: tools/gpu/pack-variants.sh BUILD main=- wsp=... b256=... ystage=... b256y=...
#   wspw2=... noA=... noB=... noAB=...; tests_b256y.txz and tests_ystage.txz with each patch
#   applied (tools/gpu/pack-tests.sh).
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
s0=$SECONDS
B=${RW_CALL_BUDGET:-570}
left() { echo $((B - (SECONDS - s0))); }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$R/y_gpu.txt"
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
if [ "${mem:-0}" -ge 100000 ]; then
    mkdir -p /tmp/rw-g && tar xf .gpu-pack/variants.txz -C /tmp/rw-g
    timeout 200 /tmp/rw-g/rw-main $C decode --batches 1,256 --ctxs 1024 --steps 10 --gen 1,16,2 \
        --gen-reps 1 > "$R/y_g123.jsonl" 2> "$R/y_g123.err"
    echo "rw-bench exit $?"
    python3 tools/bench/report.py "$R/y_g123.jsonl" 2>/dev/null | grep -E '^\| G[123] '
    tail -2 "$R/y_g123.err"
    echo "target rows done at $((SECONDS - s0)) s"
fi
timeout 150 tools/gpu/run-packed.sh .gpu-pack/tests_b256y.txz \
    --only 'moe|invariance|kernels_gpu|transformers' > "$R/y_tests_b256y.txt" 2>&1
echo "b256y tests exit $? at $((SECONDS - s0)) s"; tail -n 10 "$R/y_tests_b256y.txt"
[ -f "$R/failed.log" ] && mv "$R/failed.log" "$R/y_failed_b256y.log" && tail -n 40 "$R/y_failed_b256y.log"
rm -f "$R/suite.txt"
l=$(left); [ $l -gt 190 ] && l=190
RW_VARIANT_TIMEOUT=40 timeout $l tools/gpu/run-variants.sh --rounds 2 main wsp b256 ystage b256y \
    -- $C kernels --kernel-attention p1x128 --expert-tokens 16384,2048 --dense-tokens 1 \
    > /dev/null 2>&1
mv "$R/variants.txt" "$R/y_kernels.txt"
python3 tools/bench/variant_lines.py "$R/y_kernels.txt" --what 'experts'
echo "kernels done at $((SECONDS - s0)) s"
l=$(left)
if [ $l -ge 60 ]; then
    timeout 55 tools/gpu/run-packed.sh .gpu-pack/tests_ystage.txz --only 'moe_experts' \
        > "$R/y_tests_ystage.txt" 2>&1
    echo "ystage tests exit $? at $((SECONDS - s0)) s"; tail -n 3 "$R/y_tests_ystage.txt"
    [ -f "$R/failed.log" ] && mv "$R/failed.log" "$R/y_failed_ystage.log"
    rm -f "$R/suite.txt"
fi
l=$(left)
if [ $l -ge 70 ]; then
    [ $l -gt 120 ] && l=120
    RW_VARIANT_TIMEOUT=40 timeout $l tools/gpu/run-variants.sh --rounds 1 main b256y ystage b256 \
        -- $C prefill --prefill-reps 2 --no-quant > /dev/null 2>&1
    mv "$R/variants.txt" "$R/y_prefill.txt"
    python3 tools/bench/variant_lines.py "$R/y_prefill.txt" --what 'prefill'
    echo "prefill done at $((SECONDS - s0)) s"
fi
l=$(left)
[ $l -ge 115 ] && bash docs/results/2026-12-07g/run8.sh
echo "call took $((SECONDS - s0)) s"
