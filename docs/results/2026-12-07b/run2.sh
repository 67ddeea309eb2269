#!/usr/bin/env bash
# Forty-third session, for a call with little device time left (failed starts took most of it):
# ../2026-12-07/run5.sh's parts reordered so the most wanted comes first. On an H200 the target
# rows G1 / G2 / G3 (not measured there since the thirtieth session) come first; then the stream
# probe, narrow16's GPU tests, and main and narrow16 in turns with what time is left. Same
# archives as run5.sh (.gpu-pack: stream_probe, tests_narrow16.txz, variants.txz; its header
# says how to build them).
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$R/n_gpu.txt"
s0=$SECONDS
B=${RW_CALL_BUDGET:-480}
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
if [ "${mem:-0}" -ge 100000 ]; then
    mkdir -p /tmp/rw-variants && tar xf .gpu-pack/variants.txz -C /tmp/rw-variants
    timeout $((B - 20)) /tmp/rw-variants/rw-main $C decode --batches 1,256 --ctxs 1024 \
        --steps 10 --gen 1,16,2 --gen-reps 1 > "$R/n_g123.jsonl" 2> "$R/n_g123.err"
    echo "rw-bench exit $?"
    python3 tools/bench/report.py "$R/n_g123.jsonl" 2>/dev/null | grep -E '^\| G[123] '
    tail -3 "$R/n_g123.err"
    echo "target rows done at $((SECONDS - s0)) s"
    P="--batches 1,256 --ctxs 1024"
else
    P="--batches 256 --ctxs 512"
fi
left=$((B - (SECONDS - s0)))
if [ $left -ge 120 ]; then
    timeout 60 .gpu-pack/stream_probe > "$R/n_probe.jsonl" 2> "$R/n_probe.err"; echo "probe exit $?"
    timeout 40 .gpu-pack/stream_probe --stages 4 --smem-kb 73 > "$R/n_probe_st4.jsonl" 2>> "$R/n_probe.err"
    echo "probe st4 exit $?"; cat "$R/n_probe.err"
    echo "probe done at $((SECONDS - s0)) s"
fi
rc=1
left=$((B - (SECONDS - s0)))
if [ $left -ge 170 ]; then
    timeout 150 tools/gpu/run-packed.sh .gpu-pack/tests_narrow16.txz \
        --only "moe_experts_gpu|worker_invariance_gpu|worker_cuda_vs_transformers_gpu" > "$R/n_tests.txt" 2>&1
    rc=$?
    tail -5 "$R/n_tests.txt"; grep -h "quantized weights" /tmp/rw-packed/logs/*.log 2>/dev/null | sort -u
    [ -f "$R/failed.log" ] && { tail -c 3000 "$R/failed.log"; echo "tests failed"; }
    echo "tests (exit $rc) done at $((SECONDS - s0)) s"
fi
V="main narrow16"
[ $rc -ne 0 ] && V="main"
VT=$((B - (SECONDS - s0) - 10)); [ $VT -gt 360 ] && VT=360
if [ $VT -ge 60 ]; then
    OUT=$R/v RW_VARIANT_TIMEOUT=100 timeout $VT tools/gpu/run-variants.sh --rounds 3 $V -- $C \
        decode $P --steps 10 --gen 1,16,2 --gen-reps 1 --no-forward
    python3 tools/bench/variant_lines.py "$R/v/variants.txt" --what "decode_bf16|decode_mxfp8"
    mv "$R/v/variants.txt" "$R/n_variants.txt"; rm -rf "$R/v"
fi
echo "all took $((SECONDS - s0)) s"
