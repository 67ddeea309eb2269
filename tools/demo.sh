#!/usr/bin/env bash
# The main job: installs dependencies, builds, and runs rw end to end on the embedded tiny model.
# A worker starts with random weights (CUDA when a GPU is there, else the CPU backend); rw-trainer
# pushes the fixture's weights into it over ZeroMQ as one update; rw-ctl generates for the
# fixture's four prompts; the tokens are printed with their logprobs and checked against the
# fixture's greedy reference (computed by transformers). Exits non-zero on any failure; the
# worker is stopped in every case.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh
tools/build.sh
b=${RW_BUILD_DIR:-build}
fixture=tests/fixtures/qwen3-moe-tiny
ref=$fixture/reference.safetensors
ntok=24

tmp=$(mktemp -d)
worker_pid=
cleanup() {
    if [ -n "$worker_pid" ] && kill -0 "$worker_pid" 2>/dev/null; then
        kill -TERM "$worker_pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$worker_pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$worker_pid" 2>/dev/null || true
    fi
    rm -rf "$tmp"
}
trap cleanup EXIT
die() {
    echo "demo: FAILED: $*" >&2
    [ -f "$tmp/worker.log" ] && { echo "--- worker log:" >&2; tail -20 "$tmp/worker.log" >&2; }
    exit 1
}

# The int32 values of tensor $2 in safetensors file $1 (coreutils only: the header is JSON, the
# data little-endian).
st_ints() {
    local f=$1 name=$2 hlen header ent b e
    hlen=$(od -An -t u8 -N 8 "$f" | tr -d ' ')
    header=$(head -c $((8 + hlen)) "$f" | tail -c "$hlen")
    ent=$(printf '%s' "$header" | grep -o "\"$name\": *{[^}]*}") || die "no $name in $f"
    read -r b e < <(printf '%s' "$ent" | grep -o '"data_offsets": *\[[^]]*\]' |
        grep -o '[0-9][0-9]*' | tr '\n' ' ')
    od -An -t d4 -v -j $((8 + hlen + b)) -N $((e - b)) "$f" | tr -s ' \n' ' ' | sed 's/^ //; s/ $//'
}
csv() { tr ' ' ',' <<<"$1"; }
# The n-th (from 1) JSON array of field $2 in the text $1, as space-separated values.
field_n() { grep -o "\"$2\":\[[^]]*\]" <<<"$1" | sed -n "${3}p" | sed 's/.*\[//; s/\]//; s/,/ /g'; }

echo "== checkpoint: $fixture"
"$b/tools/ckpt/rw-ckpt" inspect "$fixture"

echo "== starting a worker with random weights"
"$b/worker/rw-worker" --config "$fixture/config.json" --random-weights --seed 1 \
    --control 'tcp://127.0.0.1:*' --ready-file "$tmp/ready" >"$tmp/worker.out" 2>"$tmp/worker.log" &
worker_pid=$!
for _ in $(seq 600); do
    [ -s "$tmp/ready" ] && break
    kill -0 "$worker_pid" 2>/dev/null || die "the worker exited during start-up"
    sleep 0.1
done
[ -s "$tmp/ready" ] || die "the worker did not become ready"
ep=$(cat "$tmp/ready")
cat "$tmp/worker.out"
ctl() { "$b/tools/ctl/rw-ctl" --to "$ep" --timeout-ms 60000 "$@"; }
ctl health >/dev/null || die "health"

prompts=()
args=()
for i in 0 1 2 3; do
    prompts[i]=$(st_ints "$ref" "prompt.$i")
    args+=(--prompt "$(csv "${prompts[i]}")")
done

before=$(ctl generate "${args[@]}" --max-new-tokens "$ntok") || die "generate"
echo "random weights, prompt 0: $(field_n "$before" tokens 1)"

echo "== pushing the fixture's weights with rw-trainer (ZeroMQ)"
"$b/tools/trainer/rw-trainer" push --model "$fixture" --to "$ep" --transport zmq \
    --version demo-1 --verify --bucket-mb 16 || die "rw-trainer push"
echo

echo "== generating with rw-ctl (greedy, $ntok tokens per prompt)"
out=$(ctl generate "${args[@]}" --max-new-tokens "$ntok") || die "generate"
grep -q '"weight_version":"demo-1"' <<<"$out" || die "outputs do not carry version demo-1"
device=$(grep -o '"device": "[a-z]*"' "$tmp/worker.out" | sed 's/.*: "//; s/"//')
fail=0
for i in 0 1 2 3; do
    read -r -a toks <<<"$(field_n "$out" tokens $((i + 1)))"
    read -r -a lps <<<"$(field_n "$out" logprobs $((i + 1)))"
    read -r -a want <<<"$(st_ints "$ref" "greedy.$i")"
    echo "prompt $i: [$(csv "${prompts[i]}")]"
    line=""
    for j in "${!toks[@]}"; do
        line+=$(printf ' %d(%.3f)' "${toks[j]}" "${lps[j]}")
    done
    echo "  tokens(logprob):$line"
    if [ "${toks[*]}" != "${want[*]}" ]; then
        first=0
        while [ "${toks[first]}" = "${want[first]}" ]; do first=$((first + 1)); done
        echo "  reference:       ${want[*]}"
        echo "  differs from the reference at position $first"
        # the bf16 CUDA backend may flip a near-tie (docs/TARGETS.md F2); the CPU backend is exact
        if [ "$device" != "cuda" ] || [ "$first" -eq 0 ]; then fail=1; fi
    else
        echo "  = the fixture's greedy reference"
    fi
done
[ "$fail" -eq 0 ] || die "generated tokens differ from the fixture's greedy reference"

echo "== stopping the worker"
ctl shutdown >/dev/null || die "shutdown"
wait "$worker_pid" || die "the worker exited with status $?"
worker_pid=
echo "demo: OK (device $device)"
