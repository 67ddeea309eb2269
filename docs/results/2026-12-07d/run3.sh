#!/usr/bin/env bash
# Forty-fifth session, call 3: why the split decode kernel reads 32 x 8k keys at 0.887 of the
# copy rate (call 2: its time follows the bytes, not the busiest warp). Nsight Compute, full set,
# on one launch of main's split kernel at d32x8192 and on the faster torch peer's kernel on the
# same shape (cuDNN SDPA), for their memory and issue sections side by side.
# Archive: .gpu-pack/variants.txz (rw-main).
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$R/gpu.txt"
s0=$SECONDS
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
mkdir -p /tmp/rw-variants && tar xf .gpu-pack/variants.txz -C /tmp/rw-variants
X=/tmp/rw-variants/rw-main
timeout 150 ncu --kernel-name-base demangled -k "regex:atc_decode_kernel" --launch-skip 2 \
    --launch-count 1 --set full --import-source no -f -o "$R/rw" \
    $X $C kernels --kernel-attention d32x8192 --expert-tokens 1 --dense-tokens 1 \
    --small-tokens 1 > "$R/rw_run.log" 2>&1
echo "ncu rw exit $? at $((SECONDS - s0)) s"
ncu --import "$R/rw.ncu-rep" --page details > "$R/rw.txt"
ncu --import "$R/rw.ncu-rep" --page source --csv --print-source sass > "$R/rw_sass.csv"
python3 tools/bench/sass_table.py "$R/rw_sass.csv" > "$R/rw_sass.txt"
rm -f "$R/rw_sass.csv"
timeout 200 ncu --kernel-name-base demangled -k "regex:cudnn|fmha|sdpa|flash" --launch-skip 1 \
    --launch-count 1 --set full --import-source no -f -o "$R/peer" \
    python3 tools/peer/torch_kernels.py $C --kernel-attention d32x8192 --expert-tokens 1 \
    > "$R/peer_run.log" 2>&1
echo "ncu peer exit $? at $((SECONDS - s0)) s"
ncu --import "$R/peer.ncu-rep" --page details > "$R/peer.txt"
for f in rw peer; do
    echo "== $f"
    grep -E "^  [a-zA-Z_].*\(|Duration|DRAM Throughput|Memory Throughput|L2 Hit|L1/TEX Hit|Achieved Occupancy|Issue Slots Busy|No Eligible|Active Warps Per|Eligible Warps|Registers Per|Shared Memory Config|Waves Per SM|Mem Busy|Max Bandwidth" "$R/$f.txt" | head -30
done
head -40 "$R/rw_sass.txt"
echo "all took $((SECONDS - s0)) s"
