#!/usr/bin/env bash
# Session 25 prepared, call 3:
# Nsight Compute on one o_proj GEMM (64 x 64 wgmma tiles) and one q/k/v GEMM (128 x 128, 80
# CTAs) of main's b256 step: DRAM, L2 and SM throughput, to check the L2 estimate; first the
# GEMM and worker tests on main + all3mc4 (tests_s25b: clusters of 4).
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
timeout 150 tools/gpu/run-packed.sh .gpu-pack/tests_s25b.txz --only 'gemm|worker' \
    > "$R/r7_suite_b.txt" 2>&1
tail -12 "$R/r7_suite_b.txt"
[ -f "$R/failed.log" ] && mv "$R/failed.log" "$R/r7_failed_b.log"
rm -f "$R/suite.txt"
tools/gpu/run-packed.sh .gpu-pack/tests_s24.txz --unpack-only > /dev/null 2>&1
export RW_BUILD_DIR=${RW_PACK_DIR:-/tmp/rw-packed}
for k in oproj:'gemm_kernel<.int.64, .int.64, ' qkv:'gemm_kernel<.int.128, .int.128, '; do
    n=${k%%:*}
    rm -rf "$R/ncu_$n"
    OUT=$R/ncu_$n timeout 80 tools/gpu/kernel-profile.sh --count 1 "${k#*:}" > "$R/r7_ncu_$n.log" 2>&1
    mv "$R/ncu_$n/profile.txt" "$R/r7_ncu_$n.txt" 2> /dev/null
    mv "$R/ncu_$n/profile_sass.txt" "$R/r7_sass_$n.txt" 2> /dev/null
    rm -rf "$R/ncu_$n"
    grep -E "Duration|DRAM Throughput|L2 Cache Throughput|L1/TEX Cache Throughput|Compute \(SM\) Throughput|Registers Per|Achieved Occupancy|Issue Slots Busy" "$R/r7_ncu_$n.txt"
done
