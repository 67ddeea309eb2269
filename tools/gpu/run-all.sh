#!/usr/bin/env bash
# run-all.sh - the one command for the GPU machine (2x H200): builds rw for sm_90a (release), runs
# the gpu and cpu test suites, the benchmarks (rw-bench, every mode) and the transformers peer,
# and writes every log and JSON result under $OUT (./out when unset). Each stage runs under its
# own time limit and inside one overall budget, so a hang costs one stage, not the run; a failing
# stage does not stop the others. A summary table is printed last.
#
#   tools/gpu/run-all.sh [--tests-only | --bench-only] [--no-peer] [--no-build] [--full]
#                        [--parallel-peer] [--budget SECONDS] [--modes LIST]
#
#   --tests-only      build, then the gpu and cpu suites
#   --bench-only      build (a no-op when build-gpu is current), then benchmarks and the peer
#   --no-peer         skip tools/peer/hf_generate.py
#   --no-build        use build-gpu as it is
#   --full            rw-bench's full sweeps (longer than one 10-minute call: use with --modes)
#   --parallel-peer   run the peer on GPU 1 while rw-bench's prefill/decode run on GPU 0 (saves
#                     about a minute; the peer line records it)
#   --budget S        overall seconds (default 570, under the machine's 600 s per command)
#   --modes LIST      rw-bench stages to run, comma-separated, from
#                     ceilings,sync,pack,disk,engine,kernels (default all but kernels; engine =
#                     prefill and decode; kernels = G6/G7: rw-bench kernels, then
#                     tools/peer/torch_kernels.py on the same shapes and routing)
#
# Environment: OUT (results), RW_COMMIT (the commit being measured: the machine's copy of the
# tree has no .git, so pass RW_COMMIT=$(git rev-parse --short=12 HEAD) from the checkout),
# RW_BENCH_ARGS (more rw-bench options), RW_PEER_ARGS (more peer options), RW_TEST_JOBS (parallel
# gpu tests, default 2), RW_BUILD_DIR (default build-gpu), RW_SCRATCH (disk benchmark checkpoint, default /tmp/rw-bench: local disk,
# never under $OUT, whose files are copied back).
#
# Layout of $OUT: logs/<stage>.log, bench/<stage>.jsonl (rw-bench and peer JSON lines),
# summary.txt (the table printed last), env.txt (machine, toolkit, versions), report.md (the
# BENCHMARKS.md section tools/bench/report.py makes from bench/*.jsonl).
set -u -o pipefail
cd "$(dirname "$0")/../.." || exit 2
root=$(pwd)

tests=1 bench=1 peer=1 build=1 full=0 parallel_peer=0 budget=570 modes="ceilings,sync,pack,disk,engine"
while [ $# -gt 0 ]; do
    case "$1" in
    --tests-only) bench=0; peer=0 ;;
    --bench-only) tests=0 ;;
    --no-peer) peer=0 ;;
    --no-build) build=0 ;;
    --full) full=1 ;;
    --parallel-peer) parallel_peer=1 ;;
    --budget) shift; budget=$1 ;;
    --modes) shift; modes=$1 ;;
    -h | --help) sed -n '2,32p' "$0"; exit 0 ;;
    *) echo "run-all.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done

OUT=${OUT:-$root/out}
mkdir -p "$OUT/logs" "$OUT/bench"
OUT=$(cd "$OUT" && pwd)
t_start=$(date +%s)
deadline=$((t_start + budget))
reserve=20 # seconds kept for the report and the summary

[ -d /usr/local/cuda/bin ] && export PATH="/usr/local/cuda/bin:$PATH"
if [ -f .deps/env.sh ]; then
    # shellcheck disable=SC1091
    source .deps/env.sh
else
    echo "run-all.sh: no .deps/env.sh (carry .deps from tools/gpu/stage-deps.sh); building with what is installed" >&2
fi
export NCCL_NVLS_ENABLE=0 # NVLink multicast stays off on these machines
if [ -z "${RW_COMMIT:-}" ] && git rev-parse --git-dir >/dev/null 2>&1; then
    RW_COMMIT=$(git describe --always --dirty --abbrev=12 2>/dev/null || echo unknown)
fi
export RW_COMMIT=${RW_COMMIT:-unknown}
export RW_LOG=${RW_LOG:-warn}

names=() statuses=() secs=() outs=()
record() { names+=("$1"); statuses+=("$2"); secs+=("$3"); outs+=("$4"); }

# stage NAME LIMIT_S JSON(0|1) CMD...: runs CMD under `timeout`, stdout+stderr to logs/NAME.log,
# or stdout to bench/NAME.jsonl and stderr to the log when JSON is 1.
stage() {
    local name=$1 limit=$2 json=$3
    shift 3
    local now left
    now=$(date +%s)
    left=$((deadline - now - reserve))
    if [ "$left" -lt 15 ]; then
        record "$name" "SKIPPED (budget spent)" 0 "-"
        echo "=== $name: skipped, ${left}s left of the budget"
        return 1
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    local log="$OUT/logs/$name.log" res="-"
    echo "=== $name (limit ${limit}s): $*"
    local t0 rc
    t0=$(date +%s)
    if [ "$json" = 1 ]; then
        res="$OUT/bench/$name.jsonl"
        # rw-bench skips (with "skipped" lines) what it cannot finish 25 s before the kill
        RW_BENCH_TIME_LIMIT=$((limit > 50 ? limit - 25 : limit / 2)) \
            timeout --kill-after=10 "$limit" "$@" >"$res" 2>"$log"
        rc=$?
    else
        timeout --kill-after=10 "$limit" "$@" >"$log" 2>&1
        rc=$?
    fi
    local dt=$(($(date +%s) - t0)) st
    case $rc in
    0) st="ok" ;;
    124 | 137) st="TIMEOUT after ${limit}s" ;;
    *) st="FAILED (exit $rc)" ;;
    esac
    if [ "$json" = 1 ] && [ -f "$res" ]; then
        local nerr nline
        nline=$(grep -c '^{' "$res" || true)
        nerr=$(grep -c '"error"' "$res" || true)
        st="$st, $nline lines, $nerr errors"
    fi
    record "$name" "$st" "$dt" "${res#"$OUT"/}"
    if [ $rc -ne 0 ]; then
        echo "--- last lines of $log:"
        tail -n 8 "$log"
    fi
    return $rc
}

{
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "commit: $RW_COMMIT"
    echo "host: $(hostname) ($(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo))"
    nvidia-smi --query-gpu=index,name,memory.total,driver_version,clocks.max.sm --format=csv 2>&1
    nvidia-smi topo -m 2>&1 | head -n 6
    nvcc --version 2>&1 | tail -n 2
    python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)' 2>&1 | tail -n 1
    env | grep -E '^(NCCL_|CUDA_VISIBLE)' || true
} >"$OUT/env.txt" 2>&1

bdir=${RW_BUILD_DIR:-build-gpu}
if [ $build = 1 ]; then
    if [ ! -f "$bdir"/build.ninja ]; then
        stage configure 120 0 meson setup "$bdir" --buildtype=release -Dcuda=enabled -Dgpu_arch=90a
    fi
    if [ $tests = 1 ]; then
        stage build 360 0 ninja -C "$bdir" -j "$(nproc)"
    else # benchmarks only: the two programs they run
        stage build 360 0 ninja -C "$bdir" -j "$(nproc)" tools/bench/rw-bench tools/ckpt/rw-ckpt
    fi
fi
have_build=0
[ -x "$bdir"/tools/bench/rw-bench ] && have_build=1

if [ $tests = 1 ]; then
    if [ -f "$bdir"/build.ninja ]; then
        stage test-gpu 240 0 meson test -C "$bdir" --suite gpu --print-errorlogs --no-rebuild \
            --num-processes "${RW_TEST_JOBS:-2}"
        stage test-cpu 150 0 meson test -C "$bdir" --suite cpu --print-errorlogs --no-rebuild \
            --num-processes "$(nproc)"
    else
        record tests "SKIPPED (no build)" 0 "-"
    fi
fi

# the same batch and lengths as rw-bench's generate (its defaults: --gen 64,128,128)
peer_cmd=(python3 tools/peer/hf_generate.py --batch 64 --prompt 128 --new 128 --max-seconds 170)

if [ $bench = 1 ]; then
    if [ $have_build = 0 ]; then
        record bench "SKIPPED (rw-bench not built)" 0 "-"
    else
        rwb="$bdir/tools/bench/rw-bench"
        read -ra extra <<<"${RW_BENCH_ARGS:-}"
        [ $full = 1 ] && extra+=(--full)
        scratch=${RW_SCRATCH:-/tmp/rw-bench}
        peer_pid=""
        for m in ${modes//,/ }; do
            case $m in
            ceilings) stage ceilings 60 1 "$rwb" ceilings "${extra[@]}" ;;
            sync) stage sync 180 1 "$rwb" sync "${extra[@]}" ;;
            pack) stage pack 60 1 "$rwb" pack "${extra[@]}" ;;
            disk) stage disk 150 1 "$rwb" disk --scratch "$scratch" "${extra[@]}" ;;
            engine)
                if [ $peer = 1 ] && [ $parallel_peer = 1 ]; then
                    echo "=== peer on cuda:1, concurrent with rw-bench prefill,decode on GPU 0"
                    (
                        t0=$(date +%s)
                        # shellcheck disable=SC2086
                        timeout --kill-after=10 200 "${peer_cmd[@]}" --device cuda:1 \
                            --note "ran on GPU 1 while rw-bench prefill,decode ran on GPU 0" \
                            ${RW_PEER_ARGS:-} >"$OUT/bench/peer.jsonl" 2>"$OUT/logs/peer.log"
                        echo "$? $(($(date +%s) - t0))" >"$OUT/logs/peer.rc"
                    ) &
                    peer_pid=$!
                fi
                stage engine 300 1 "$rwb" prefill,decode "${extra[@]}"
                ;;
            kernels)
                stage kernels 120 1 "$rwb" kernels "${extra[@]}" &&
                    stage peer-kernels 150 1 python3 tools/peer/torch_kernels.py \
                        --rw "$OUT/bench/kernels.jsonl"
                ;;
            *) record "$m" "SKIPPED (unknown mode)" 0 "-" ;;
            esac
        done
        if [ -n "$peer_pid" ]; then
            wait "$peer_pid"
            read -r prc pdt <"$OUT/logs/peer.rc"
            case $prc in 0) pst=ok ;; 124 | 137) pst="TIMEOUT" ;; *) pst="FAILED (exit $prc)" ;; esac
            record peer "$pst (concurrent, cuda:1)" "$pdt" "bench/peer.jsonl"
        fi
    fi
fi
if [ $peer = 1 ] && [ $parallel_peer = 0 ]; then
    # shellcheck disable=SC2086
    stage peer 200 1 "${peer_cmd[@]}" --device cuda:0 ${RW_PEER_ARGS:-}
fi

# the report section, from whatever results exist (python3 standard library only)
if ls "$OUT"/bench/*.jsonl >/dev/null 2>&1; then
    timeout 30 python3 tools/bench/report.py "$OUT"/bench/*.jsonl --md "$OUT/report.md" \
        --plots-dir "$OUT/plots" --png-dir . >"$OUT/logs/report.log" 2>&1 ||
        echo "run-all.sh: report.py failed (see logs/report.log)"
    if command -v gnuplot >/dev/null; then
        timeout 30 tools/bench/plots.sh "$OUT/plots" "$OUT/plots" >>"$OUT/logs/report.log" 2>&1 || true
    fi
fi

{
    echo
    echo "== run-all.sh summary: commit $RW_COMMIT, $(($(date +%s) - t_start)) s of a ${budget} s budget; results in $OUT"
    printf '%-10s %-48s %6s  %s\n' stage status seconds output
    for i in "${!names[@]}"; do
        printf '%-10s %-48s %6s  %s\n' "${names[$i]}" "${statuses[$i]}" "${secs[$i]}" "${outs[$i]}"
    done
    if ls "$OUT"/bench/*.jsonl >/dev/null 2>&1; then
        echo
        timeout 30 python3 tools/bench/report.py "$OUT"/bench/*.jsonl --summary 2>/dev/null ||
            echo "(report.py --summary failed)"
    fi
} | tee "$OUT/summary.txt"

failed=0
for s in "${statuses[@]}"; do
    case $s in ok*) ;; *) failed=$((failed + 1)) ;; esac
done
[ $failed -gt 0 ] && echo "run-all.sh: $failed stage(s) not ok"
exit $((failed > 0))
