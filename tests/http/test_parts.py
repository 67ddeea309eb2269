#!/usr/bin/env python3
"""test_parts.py - HTTP generations whose final result the worker sends in parts (a worker started
with --max-reply-bytes 65536: 6 outputs of 200 tokens with 20 top logprobs each are about 380 KB).
The HTTP side must wait for the last part and join every output's pieces: /generate (plain and
streamed) returns the tokens and top logprobs that `generate` over ZeroMQ returns for the same
greedy request (rw-ctl joins the parts through the client library)."""

import sys

import http_util
from http_util import Checks, Worker

NP, NT, TOP = 6, 200, 20


def main():
    ok = Checks()
    ref = http_util.reference()
    prompts = [ref["prompts"][i % 4] + [i + 1] for i in range(NP)]
    w = Worker("--max-reply-bytes", "65536")
    try:
        w.push_fixture("v1")
        args = ["generate"]
        for p in prompts:
            args += ["--prompt", ",".join(map(str, p))]
        args += ["--max-new-tokens", str(NT), "--top-logprobs", str(TOP)]
        zr = w.ctl(*args)
        zouts = zr["outputs"]
        ok(len(zouts) == NP and all(len(o["tokens"]) == NT for o in zouts),
           "ZeroMQ: %d outputs of %s tokens" % (len(zouts), sorted({len(o["tokens"]) for o in zouts})))
        body = {"input_ids": prompts, "return_logprob": True, "top_logprobs_num": TOP,
                "sampling_params": {"max_new_tokens": NT, "temperature": 0, "ignore_eos": True}}
        st, _, r = w.request("POST", "/generate", body)
        ok(st == 200 and isinstance(r, list) and len(r) == NP,
           "HTTP /generate: status %d, %s outputs" % (st, len(r) if isinstance(r, list) else r))
        for i in range(min(NP, len(r) if isinstance(r, list) else 0)):
            ids = r[i]["output_ids"]
            top = r[i]["meta_info"].get("output_top_logprobs", [])
            top_ids = [[t[1] for t in row] for row in top]
            want_top = [[t[0] for t in row] for row in zouts[i]["top_logprobs"]]
            ok(ids == zouts[i]["tokens"], "output %d: %d ids, equal to ZeroMQ's" % (i, len(ids)))
            ok(top_ids == want_top, "output %d: top logprob ids equal to ZeroMQ's" % i)
            ok(r[i]["meta_info"].get("finish_reason") is not None, "output %d: finished" % i)
        # streamed: partial replies, then the final result in parts
        body["stream"] = True
        st, _, text = w.request("POST", "/generate", body)
        last = {}
        if isinstance(text, str):
            for line in text.splitlines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    ev = http_util.json.loads(line[len("data: "):])
                    last[ev["index"] if "index" in ev else len(last)] = ev
        got = [last[k]["output_ids"] for k in sorted(last)] if last else []
        ok(st == 200 and got == [o["tokens"] for o in zouts],
           "HTTP /generate stream: %d outputs, their last events equal to ZeroMQ's" % len(got))
    finally:
        code = w.stop()
    ok(code == 0, "worker exit status %d" % code)
    if ok.failed:
        print(w.log()[-3000:])
    return ok.done()


if __name__ == "__main__":
    sys.exit(main())
