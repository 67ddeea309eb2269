#!/usr/bin/env bash
# Prepared in the fifty-first session (not run: the session's device time was spent). run1.sh
# found f16att failing the tiny fixture's F2 test; on the CPU the emulation, rounding q where the
# kernel does, then gave the GPU's numbers (a router near-tie flipped: README), so f16att needs no
# more device time. What this call runs is main's tests grown from it, then the expert
# candidates of ../2026-12-07i/run1.sh:
#  1. the attention test with the engine's tile width (3cc486f: the prefill kernel at head_dim
#     32 and 64 against the reference, and inside the invariance test), the F2 tests (ea3d0bd:
#     each now prints the GPU's own routing of the prompts against the fp32 forward's, and the
#     high-precision ones assert it unchanged) and the invariance tests;
#  2. the expert layer at 16,384 and 2048 tokens for main and s2, b256p, dbar, rsp (one round),
#     and the tests of those 1.5% or more under main.
# Archives (carry .deps and .gpu-pack): tests_all.txz = tools/gpu/merge-packs.sh of main (this
# session's head, tools/gpu/pack-tests.sh) and ../2026-12-07i's rsp, s2, b256p and dbar test
# archives; variants.txz as ../2026-12-07i/README.md says. About 3 minutes.
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
s0=$SECONDS
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$R/gpu.txt"
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
one() { # TAG VARIANT REGEX
    timeout 120 tools/gpu/run-packed.sh .gpu-pack/tests_all.txz --variant "$2" --only "$3" \
        --all-logs > "$R/t_$1.txt" 2>&1
    echo "== $1 ($2) exit $? at $((SECONDS - s0)) s"
    grep -h "F2:\|routing on the GPU\|emulation of its\|OK \|FAIL\|EXPECTED\|PASS" \
        "$R/t_$1.txt" "$R"/tests/*.log 2> /dev/null | head -24
    mkdir -p "$R/logs_$1" && mv "$R"/tests/*.log "$R/logs_$1/" 2> /dev/null
    rm -rf "$R/tests" "$R/suite.txt" "$R/failed.log"
}
one main main 'attention_gpu|transformers.*_gpu|invariance'
RW_VARIANT_TIMEOUT=30 timeout 120 tools/gpu/run-variants.sh --rounds 1 main s2 b256p dbar rsp \
    -- $C kernels --kernel-attention p1x128 --expert-tokens 16384,2048 --dense-tokens 1 \
    > /dev/null 2>&1
mv "$R/variants.txt" "$R/kernels.txt"
python3 tools/bench/variant_lines.py "$R/kernels.txt" --what 'experts'
cands=$(python3 - "$R/kernels.txt" s2 b256p dbar rsp <<'PY'
import sys
sys.path.insert(0, "tools/bench")
import variant_lines as vl
t = {}
for v, _, j in vl.read(sys.argv[1]):
    if j.get("what") == "experts_t16384" and "median_s" in j:
        t.setdefault(v, []).append(j["median_s"])
m = min(t.get("main", [1e9]))
print(" ".join(v for v in sys.argv[2:] if v in t and min(t[v]) <= 0.985 * m))
PY
)
echo "faster candidates: ${cands:-none}"
for v in $cands; do
    one "cand_$v" "$v" 'moe|invariance|kernels_gpu|transformers'
done
echo "call took $((SECONDS - s0)) s"
