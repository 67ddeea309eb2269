#!/usr/bin/env bash
# Forty-first session, call 2 (the machine still warm after call 1): the pf256 variant's mxfp8
# w13 tile (rw-pf256 from call 1's variants.txz) under Nsight Compute, as call 1 profiled main's.
source .deps/env.sh; rm -rf /tmp/pb; mkdir -p /tmp/pb/tools/bench $OUT
cd /tmp && tar -xJf /work/main/.gpu-pack/variants.txz rw-pf256 2>/dev/null || tar -xJf $OLDPWD/.gpu-pack/variants.txz rw-pf256; cd $OLDPWD
cp /tmp/rw-pf256 /tmp/pb/tools/bench/rw-bench && OUT=$OUT/p RW_BUILD_DIR=/tmp/pb timeout 200 tools/gpu/kernel-profile.sh --quant --count 1 'moe_gemm_kernel<.int.32, .int.1, .bool.1, .bool.1' > $OUT/pf_profile_log.txt 2>&1
grep -E "Duration|DRAM Throughput|Issue Slots Busy|Eligible Warps|Executed Instructions|L2 Hit" $OUT/p/profile.txt | head; tail -3 $OUT/pf_profile_log.txt
