#!/usr/bin/env python3
"""test_python_client.py - the Python client (python/rw_client, the package) against a CPU worker,
without torch: start a random-weight worker, push the fixture's weights over ZeroMQ from Python,
verify every checksum against the trainer-side computation, reproduce the fixture's greedy
tokens (also streamed), read a tensor back, pause / resume, stats, stop. Exits 77 (skip) when
the client library or the worker is not built."""

import os
import struct
import sys
import time

ROOT = os.environ.get("RW_SOURCE_ROOT", os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))

import rw_client  # noqa: E402
import rw_client.client as rw_client_impl  # noqa: E402
from rw_client import Client, RWError, Worker, load_safetensors  # noqa: E402

FIXTURE = os.path.join(ROOT, "tests", "fixtures", "qwen3-moe-tiny")
CONFIG = os.path.join(FIXTURE, "config.json")


def ints(raw, fmt):
    n = len(raw) // struct.calcsize(fmt)
    return list(struct.unpack("<%d%s" % (n, fmt), raw))


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def main():
    try:
        rw_client.find_library()
        rw_client.find_worker()
    except FileNotFoundError as e:
        print("skip:", e)
        return 77
    ref = load_safetensors(os.path.join(FIXTURE, "reference.safetensors"))
    prompts = [ints(ref["prompt.%d" % i][2], "i") for i in range(4)]
    greedy = [ints(ref["greedy.%d" % i][2], "i") for i in range(4)]
    weights = load_safetensors(os.path.join(FIXTURE, "model.safetensors"))

    with Worker(config=CONFIG, random_weights=True, seed=5, device="cpu", kv_mb=64) as w:
        c = Client(w.endpoint)
        check(c.health()["status"] == "ok", "health")
        before = c.generate(prompts[:1], max_new_tokens=24)[0]
        check(before["tokens"] != greedy[0], "random weights already give the reference")
        # a weight refused before anything is written: the session aborts, weights intact
        try:
            c.push_zmq({"model.norm.weight": ("bf16", [7], b"\0" * 14)}, version="bad")
            raise AssertionError("a mis-shaped tensor was accepted")
        except RWError as e:
            check(e.status == "shape", "mis-shaped push: %s" % e)
        check(c.get_weight_version()["state"] == "ready", "state after the refused push")
        # the fixture over ZeroMQ, two buckets
        res = c.push_zmq(weights, version="py-v1", bucket_bytes=2 << 20)
        check(res["version"] == "py-v1" and res["buckets"] >= 2, "commit: %s" % res)
        n = c.verify_checksums(weights, CONFIG)
        check(n == len(weights), "checked %d of %d" % (n, len(weights)))
        outs = c.generate(prompts, max_new_tokens=24)
        for i, o in enumerate(outs):
            check(o["tokens"] == greedy[i], "prompt %d: %s vs %s" % (i, o["tokens"], greedy[i]))
            check(o["weight_version"] == "py-v1", "version %s" % o["weight_version"])
            check(len(o["logprobs"]) == 24, "logprobs")
        # streaming: partial chunks are slices of the final tokens
        parts, final = [], None
        for r in c.generate_stream([prompts[2]], max_new_tokens=24):
            if r["stream"]:
                parts.append(r)
            else:
                final = r
        toks = final["outputs"][0]["tokens"]
        check(toks == greedy[2], "streamed final tokens")
        check(parts, "no partial results")
        for p in parts:
            for o in p["outputs"]:
                check(toks[o["offset"]:o["offset"] + len(o["tokens"])] == o["tokens"],
                      "partial chunk")
        # one prompt alone, as a flat list (or a tuple), gives the same output as a batch of one
        one = c.generate(prompts[0], max_new_tokens=24)
        check(len(one) == 1 and one[0]["tokens"] == greedy[0], "generate(one prompt)")
        check(c.generate(tuple(prompts[1]), max_new_tokens=24)[0]["tokens"] == greedy[1],
              "generate(a tuple of ids)")
        for bad, kind, words in (([1, "2"], TypeError, "expected token ids"),
                                 ([[1], [2.5]], TypeError, "prompts[1][0]"),
                                 ([1, -2], ValueError, "negative"), ([], TypeError, "expected"),
                                 ([[]], ValueError, "empty prompt"), (7, TypeError, "got 7")):
            try:
                c.generate(bad)
                raise AssertionError("generate(%r) was accepted" % (bad,))
            except kind as e:
                check(words in str(e), "generate(%r): %s" % (bad, e))
        try:
            c.generate("text", max_new_tokens=2)
            raise AssertionError("text without a tokenizer was accepted")
        except RWError as e:
            check(e.status == "unsupported" and "--tokenizer" in e.message, "text needs a tokenizer")
        t0 = time.time()
        try:
            Client("tcp://127.0.0.1:1")
            raise AssertionError("a client of nothing was made")
        except RWError as e:
            check("nothing listens at tcp://127.0.0.1:1" in e.message and time.time() - t0 < 3,
                  "Client of an address where nothing listens: %s" % e)
        # readback
        meta, data = c.get_weights("model.layers.1.self_attn.o_proj.weight")
        check(data == weights["model.layers.1.self_attn.o_proj.weight"][2], "readback bytes")
        check(meta["shape"] == [128, 128], "readback shape %s" % meta["shape"])
        # pause / resume and stats
        check(c.pause("retract")["paused"], "pause")
        check(c.stats()["state"] == "paused", "paused state")
        c.resume()
        st = c.stats()
        check(st["weights"]["version"] == "py-v1" and st["weights"]["updates"] == 1, "stats")
        # a bucket smaller than the largest tensors (embedding and lm_head, 128 KiB): they go as
        # row pieces (shard dim 0), the way rw-trainer push cuts them
        check(rw_client_impl._pieces("t", [10, 4], 80, 1 << 20) == [None], "a tensor that fits")
        check(rw_client_impl._pieces("t", [300, 4], 2400, 1000) == [(0, 125), (125, 125),
                                                                  (250, 50)], "row pieces")
        check(rw_client_impl._pieces("t", [1024, 2], 4096, 1100) == [(0, 256), (256, 256),
                                                                   (512, 256), (768, 256)],
              "pieces cut at multiples of 128 rows")
        big = max(len(v[2]) for v in weights.values())
        res = c.push_zmq(weights, version="py-rows", bucket_bytes=big // 3 + 100)
        check(res["version"] == "py-rows", "commit of row pieces: %s" % res)
        n = c.verify_checksums(weights, CONFIG)
        check(n == len(weights), "row pieces: checked %d of %d" % (n, len(weights)))
        o = c.generate(prompts[:1], max_new_tokens=24)[0]
        check(o["tokens"] == greedy[0] and o["weight_version"] == "py-rows", "after row pieces")
        # update sessions belong to their opener (protocol 2): another client is refused, an
        # operator's forced abort ends it
        c.begin_update("py-owned")
        check(len(c.session) == 32, "session token %r" % c.session)
        c2 = Client(w.endpoint)
        try:
            c2.commit_update()
            raise AssertionError("another client committed the session")
        except RWError as e:
            check(e.status == "auth", "foreign commit: %s" % e)
        check(c.get_weight_version()["state"] == "updating", "session still open")
        check(c2.abort_update(force=True)["intact"], "forced abort")
        check(c.get_weight_version()["version"] == "py-rows", "version after the forced abort")
        c2.close()
        code = w.stop()
    check(code == 0, "worker exit status %s" % code)
    # precision="high" reaches the worker (--precision high); the CPU backend computes in fp32
    # either way, so the fixture's greedy tokens come out
    with Worker(model=FIXTURE, device="cpu", kv_mb=64, precision="high") as w:
        c = Client(w.endpoint)
        check(c.health()["precision"] == "high", "health: %s" % c.health())
        o = c.generate(prompts[:1], max_new_tokens=24)[0]
        check(o["tokens"] == greedy[0], "precision high: %s" % o["tokens"])
        check(w.stop() == 0, "worker exit status (precision high)")
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
