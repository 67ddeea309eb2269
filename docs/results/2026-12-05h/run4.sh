#!/usr/bin/env bash
# Session 29, call 4: the b256 decode attention (atc_decode_kernel, unsplit) instruction by
# instruction: rw-bench kernels' d256x1024 attention launch under ncu --set full, its SASS page
# summarized by tools/bench/sass_table.py (main, tests_main.txz).
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$R/r4_gpu.txt"
[ -x /tmp/rw-packed/tools/bench/rw-bench ] && [ "$(cat /tmp/rw-packed/.pack 2>/dev/null)" = main ] ||
    { tools/gpu/run-packed.sh .gpu-pack/tests_main.txz --unpack-only > /dev/null 2>&1; echo main > /tmp/rw-packed/.pack; }
B=/tmp/rw-packed/tools/bench/rw-bench
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
timeout 200 ncu --kernel-name-base demangled -k regex:atc_decode_kernel --launch-count 1 \
    --set full --import-source no -f -o "$R/r4_attn" \
    "$B" $C kernels --kernel-attention d256x1024 --expert-tokens 1 --dense-tokens 1 --reps 1 \
    > "$R/r4_run.log" 2>&1 || tail -5 "$R/r4_run.log"
ncu --import "$R/r4_attn.ncu-rep" --page details > "$R/r4_attn.txt"
ncu --import "$R/r4_attn.ncu-rep" --page source --csv --print-source sass > "$R/r4_sass.csv"
python3 tools/bench/sass_table.py "$R/r4_sass.csv" --top 40 --groups 30 > "$R/r4_sass.txt"
grep -E "Duration|DRAM Throughput|Registers Per|Issued Warp|Eligible Warps" "$R/r4_attn.txt" | head
head -60 "$R/r4_sass.txt"
gzip -f "$R/r4_sass.csv"
