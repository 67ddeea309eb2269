#!/usr/bin/env bash
# Prepared in the fiftieth session, not run: the per-phase table of docs/BENCHMARKS.md on main as
# it is, beside the peers in the same run (the issue asks for one; the last was the
# twenty-third session's, on an H200, before the expert and attention changes since): rw's
# breakdown of decode b1 and b256 and of the 8 x 2k prefill (RW_BENCH_BREAKDOWN=1), rw-bench's
# kernel lines for the dense peers (cuBLASLt), torch SDPA and grouped_mm on the same shapes
# (tools/peer/torch_kernels.py, with the G6 / G7 comparisons), then tools/bench/phase_table.py.
# Contexts of 1024 on an H200, 512 on an H100 (b256 x 1k does not fit 80 GB beside the
# weights). Any card; about 4-5 minutes. Uses the archive's main build (run1.sh's head).
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
s0=$SECONDS
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$R/c_gpu.txt"
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
mkdir -p /tmp/rw-g && tar xf .gpu-pack/variants.txz -C /tmp/rw-g
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
ctx=512; [ "${mem:-0}" -ge 100000 ] && ctx=1024
RW_BENCH_BREAKDOWN=1 timeout 240 /tmp/rw-g/rw-main $C decode,prefill --batches 1,256 \
    --ctxs $ctx --steps 10 --gen 1,16,2 --gen-reps 1 --prefill-reps 2 --no-quant \
    > "$R/c_run.jsonl" 2> "$R/c_run.err"
echo "breakdown exit $? at $((SECONDS - s0)) s"
A="d256x$ctx,d1x$ctx,p8x2048"
timeout 150 /tmp/rw-g/rw-main $C kernels --kernel-attention $A --expert-tokens 1,256,16384 \
    --dense-tokens 1,8,256,16384 > "$R/c_kernels.jsonl" 2> "$R/c_kernels.err"
echo "kernels exit $? at $((SECONDS - s0)) s"
timeout 150 python3 tools/peer/torch_kernels.py --kernel-attention $A \
    --expert-tokens 1,256,16384 --rw "$R/c_kernels.jsonl" > "$R/c_peer.jsonl" 2> "$R/c_peer.err"
echo "peer exit $? at $((SECONDS - s0)) s"
python3 tools/bench/phase_table.py "$R/c_run.jsonl" "$R/c_kernels.jsonl" "$R/c_peer.jsonl" \
    --config tools/configs/qwen3-30b-a3b.json | tee "$R/c_phase_table.md"
python3 tools/bench/report.py "$R/c_run.jsonl" 2>/dev/null | grep -E '^\| G[124] '
echo "call took $((SECONDS - s0)) s"
