#!/usr/bin/env bash
# Prepared in the fifty-second session (main 31d7d26; worker sources as in ../2026-12-07i; not
# run: no device machine was lent, README.md). One call, in order of what it is worth:
#  1. on an H200, the target rows G1 / G2 / G3 (not measured on that card since the thirtieth
#     session; ../2026-12-07h/run7.sh's command);
#  2. main's GPU test parts not yet run on a GPU (the attention test with the engine's tile
#     width, 3cc486f: the prefill kernel at head_dim 32 and 64; the F2 tests printing the GPU's
#     own routing against the fp32 forward's, ea3d0bd and fcef613) and the invariance tests;
#  3. the expert layer at 16,384 and 2048 tokens: main, the candidates s2, b256p, dbar, rsp
#     (same bits) and the forty-ninth session's timing-only diagnostics mmaonly, nosync, mmans,
#     hionly (../2026-12-07h/run6.sh says what each tells), three rounds in turns (3-4 s each);
#  4. the GPU tests of each candidate 1.5% or more under main at 16,384 tokens (best rounds);
#  5. time allowing, ../2026-12-07i/run3.sh (the per-phase table beside same-run peers).
# Archives (carry .deps and .gpu-pack): tests_all.txz = tools/gpu/merge-packs.sh of main at
# 31d7d26 (tools/gpu/pack-tests.sh) and ../2026-12-07i's rsp, s2, b256p and dbar test archives;
# variants.txz as ../2026-12-07i/README.md says. Any card; 5-9 minutes.
source .deps/env.sh
R=${OUT:-out}
mkdir -p "$R"
s0=$SECONDS
left() { echo $((580 - (SECONDS - s0))); }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$R/gpu.txt"
C="--config $(pwd)/tools/configs/qwen3-30b-a3b.json"
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
if [ "${mem:-0}" -ge 100000 ]; then
    mkdir -p /tmp/rw-g && tar xf .gpu-pack/variants.txz -C /tmp/rw-g
    timeout 200 /tmp/rw-g/rw-main $C decode --batches 1,256 --ctxs 1024 --steps 10 --gen 1,16,2 \
        --gen-reps 1 > "$R/g123.jsonl" 2> "$R/g123.err"
    echo "== G1-G3 exit $? at $((SECONDS - s0)) s"
    python3 tools/bench/report.py "$R/g123.jsonl" 2> /dev/null | grep -E '^\| G[123] '
    tail -2 "$R/g123.err"
fi
one() { # TAG VARIANT REGEX SECONDS
    timeout "$4" tools/gpu/run-packed.sh .gpu-pack/tests_all.txz --variant "$2" --only "$3" \
        --all-logs > "$R/t_$1.txt" 2>&1
    echo "== tests $1 ($2) exit $? at $((SECONDS - s0)) s"
    grep -h "F2:\|routing on the GPU\|emulation of its\|OK \|FAIL\|EXPECTED\|PASS" \
        "$R/t_$1.txt" "$R"/tests/*.log 2> /dev/null | head -24
    mkdir -p "$R/logs_$1" && mv "$R"/tests/*.log "$R/logs_$1/" 2> /dev/null
    rm -rf "$R/tests" "$R/suite.txt" "$R/failed.log"
}
one main main 'attention_gpu|transformers.*_gpu|invariance' 120
RW_VARIANT_TIMEOUT=30 timeout 240 tools/gpu/run-variants.sh --rounds 3 \
    main s2 b256p dbar rsp mmaonly nosync mmans hionly \
    -- $C kernels --kernel-attention p1x128 --expert-tokens 16384,2048 --dense-tokens 1 \
    > /dev/null 2>&1
mv "$R/variants.txt" "$R/kernels.txt"
echo "== expert variants done at $((SECONDS - s0)) s"
python3 tools/bench/variant_lines.py "$R/kernels.txt" --what 'experts'
cands=$(python3 - "$R/kernels.txt" s2 b256p dbar rsp << 'PY'
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
    [ "$(left)" -ge 100 ] && one "cand_$v" "$v" 'moe|invariance|kernels_gpu|transformers' 100
done
[ "$(left)" -ge 260 ] && bash docs/results/2026-12-07i/run3.sh
echo "call took $((SECONDS - s0)) s"
