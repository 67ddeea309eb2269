#!/usr/bin/env bash
# Session 25 prepared, call 2 (after run5 says which variants keep the bits): the b64 and b256
# decode steps, base against all3 and all3mc2 (two rounds; swap in the variant run5 found best);
# then Nsight Compute on one o_proj GEMM (64 x 64 wgmma tiles: bound by L2 reads of the
# activation pair?) and one q/k/v GEMM (128 x 128, 80 CTAs) of the base b256 step.
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
RW_VARIANT_TIMEOUT=100 timeout 400 tools/gpu/run-variants.sh --rounds 2 \
    --archive .gpu-pack/variants_s25.txz base all3 all3mc2 -- \
    $C decode --batches 64,256 --ctxs 1024 --steps 10 --gen 1,16,2 --gen-reps 1 --no-quant
mv "$R/variants.txt" "$R/r6_decode.txt"
python3 tools/bench/variant_lines.py "$R/r6_decode.txt" | grep -A4 '^decode'
# the base tiles: the twenty-fourth session's pack (main's GEMM code)
tools/gpu/run-packed.sh .gpu-pack/tests_s24.txz --unpack-only > /dev/null 2>&1
export RW_BUILD_DIR=${RW_PACK_DIR:-/tmp/rw-packed}
for k in oproj:'gemm_kernel<.int.64, .int.64, ' qkv:'gemm_kernel<.int.128, .int.128, '; do
    n=${k%%:*}
    rm -rf "$R/ncu_$n"
    OUT=$R/ncu_$n timeout 80 tools/gpu/kernel-profile.sh --count 1 "${k#*:}" > "$R/r6_ncu_$n.log" 2>&1
    mv "$R/ncu_$n/profile.txt" "$R/r6_ncu_$n.txt" 2> /dev/null
    mv "$R/ncu_$n/profile_sass.txt" "$R/r6_sass_$n.txt" 2> /dev/null
    rm -rf "$R/ncu_$n"
    grep -E "Duration|DRAM Throughput|L2 Cache Throughput|L1/TEX Cache Throughput|Compute \(SM\) Throughput|Registers Per|Achieved Occupancy|Issue Slots Busy" "$R/r6_ncu_$n.txt"
done
