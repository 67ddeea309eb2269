#!/usr/bin/env bash
# The fiftieth session's call: ../2026-12-07h/run6.sh in less device time, for a pool that
# refuses most starts. The expert layer at 16,384 and 2048 tokens for main, four same-bits
# candidates (s2, b256p, dbar, and rsp, new here) and the four timing-only splits of the w13
# loop (mmaonly, nosync, mmans, hionly; ../2026-12-07h/run6.sh's head says what each leaves
# out), 2 rounds in turns.
# Then only the candidates whose mean at 16,384 tokens is at least 1.5% under main's get their
# GPU tests and an 8 x 2k prefill beside main. On an H200, the G1-G3 rows after that (not
# measured on that card since the thirtieth session), as the time left allows; on an H100 the
# th32 / th96 tile switch (../2026-12-07g/run7.sh) instead. LIMIT: the call's seconds.
# rsp: the pipelined input-pair tile reads each block's weight fragments into registers once
# (ldmatrix) for both its hi and lo wgmma (RS form), a block's shared-memory reads 48 -> 40 KB a
# warpgroup; two fragment sets alternate by block (152 registers, no spills).
# Then q1 and f16att beside main on the attention kernels alone (prefill 8 x 2k and 1 x 8k,
# decode 256 x 1k; .gpu-pack/variants_att.txz: tools/gpu/pack-variants.sh BUILD main=-
# q1=q1.patch f16att=f16att.patch, renamed).
# Archives: .gpu-pack as ../2026-12-07h/run7.sh's head says, with rsp=rsp.patch added to
# variants.txz and tests_rsp.txz (tools/gpu/pack-tests.sh with rsp.patch applied).
source .deps/env.sh
# a variant's tests: its own archive, or its part of tests_all.txz (tools/gpu/merge-packs.sh)
tests_of() { if [ -f .gpu-pack/tests_$1.txz ]; then echo .gpu-pack/tests_$1.txz; else echo ".gpu-pack/tests_all.txz --variant $1"; fi; }
R=${OUT:-out}
mkdir -p "$R"
s0=$SECONDS
LIMIT=${LIMIT:-580}
left() { echo $((LIMIT - (SECONDS - s0))); }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$R/a_gpu.txt"
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
RW_VARIANT_TIMEOUT=40 timeout 150 tools/gpu/run-variants.sh --rounds 2 \
    main s2 b256p dbar rsp mmaonly nosync mmans hionly \
    -- $C kernels --kernel-attention p1x128 --expert-tokens 16384,2048 --dense-tokens 1 \
    > /dev/null 2>&1
mv "$R/variants.txt" "$R/a_kernels.txt"
python3 tools/bench/variant_lines.py "$R/a_kernels.txt" --what 'experts'
echo "kernels done at $((SECONDS - s0)) s"
# q1 (timing only, wrong bits): the attention tiles with one q term instead of the hi + lo
# pair; f16att (run2.sh has its tests): the attention on fp16 operands, q one fp16
RW_VARIANT_TIMEOUT=40 timeout 120 tools/gpu/run-variants.sh --archive .gpu-pack/variants_att.txz \
    --rounds 2 main q1 f16att -- $C kernels --kernel-attention p8x2048,p1x8192,d256x1024 \
    --expert-tokens 1 --dense-tokens 1 > /dev/null 2>&1
mv "$R/variants.txt" "$R/a_attention.txt"
python3 tools/bench/variant_lines.py "$R/a_attention.txt" --what 'attention'
echo "attention done at $((SECONDS - s0)) s"
# the candidates 1.5% or more under main at 16,384 tokens (mean of the rounds)
cands=$(python3 - "$R/a_kernels.txt" s2 b256p dbar rsp <<'PY'
import statistics, sys
sys.path.insert(0, "tools/bench")
import variant_lines as vl
t = {}
for v, _, j in vl.read(sys.argv[1]):
    if j.get("what") == "experts_t16384" and "median_s" in j:
        t.setdefault(v, []).append(j["median_s"])
m = statistics.mean(t.get("main", [1e9]))
print(" ".join(v for v in sys.argv[2:] if v in t and statistics.mean(t[v]) <= 0.985 * m))
PY
)
echo "faster candidates: ${cands:-none}"
for v in $cands; do
    [ "$(left)" -ge 90 ] || break
    timeout 100 tools/gpu/run-packed.sh $(tests_of $v) \
        --only 'moe|invariance|kernels_gpu|transformers' > "$R/a_tests_$v.txt" 2>&1
    echo "$v tests exit $? at $((SECONDS - s0)) s"; tail -n 3 "$R/a_tests_$v.txt"
    [ -f "$R/failed.log" ] && mv "$R/failed.log" "$R/a_failed_$v.log"
    rm -f "$R/suite.txt"
done
if [ -n "$cands" ] && [ "$(left)" -ge 100 ]; then
    RW_VARIANT_TIMEOUT=40 timeout 100 tools/gpu/run-variants.sh --rounds 1 main $cands \
        -- $C prefill --prefill-reps 2 --no-quant > /dev/null 2>&1
    mv "$R/variants.txt" "$R/a_prefill.txt"
    python3 tools/bench/variant_lines.py "$R/a_prefill.txt" --what 'prefill'
fi
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
if [ "${mem:-0}" -ge 100000 ] && [ "$(left)" -ge 120 ]; then
    mkdir -p /tmp/rw-g && tar xf .gpu-pack/variants.txz -C /tmp/rw-g
    timeout $(($(left) - 10)) /tmp/rw-g/rw-main $C decode --batches 1,256 --ctxs 1024 \
        --steps 10 --gen 1,16,2 --gen-reps 1 > "$R/a_g123.jsonl" 2> "$R/a_g123.err"
    echo "rw-bench exit $?"
    python3 tools/bench/report.py "$R/a_g123.jsonl" 2>/dev/null | grep -E '^\| G[123] '
    tail -2 "$R/a_g123.err"
elif [ "${mem:-0}" -lt 100000 ] && [ "$(left)" -ge 110 ]; then
    bash docs/results/2026-12-07g/run7.sh
fi
echo "call took $((SECONDS - s0)) s"
