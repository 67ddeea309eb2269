#!/usr/bin/env python3
"""test_python_rollout.py - the Python client's rollout calls against a CPU worker with the
fixture model, without numpy or torch: generate with n samples, processed logprobs and routed
experts (Routes out of the reply's data frame), score of the outputs (the same logprobs and
routes), prompt logprobs, the prefix-cache stats, refused options. Exits 77 (skip) when the
client library or the worker is not built."""

import os
import sys

ROOT = os.environ.get("RW_SOURCE_ROOT", os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))

import rw_client  # noqa: E402
from rw_client import Client, Routes, RWError, Worker  # noqa: E402

FIXTURE = os.path.join(ROOT, "tests", "fixtures", "qwen3-moe-tiny")


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
    prompts = [[5, 17, 99, 3, 250, 7, 41], list(range(10, 60))]
    with Worker(model=FIXTURE, device="cpu", kv_mb=64) as w:
        c = Client(w.endpoint)
        outs = c.generate(prompts, n=3, max_new_tokens=8, temperature=1.0, top_p=0.9, seed=3,
                          logprob_mode="processed", return_routed_experts=True,
                          return_routing_weights=True)
        check(len(outs) == 6, "6 outputs")
        for k, o in enumerate(outs):
            p = prompts[k // 3]
            r = o["routed_experts"]
            check(isinstance(r, Routes) and r.dtype == "u8", "routes: %r" % r)
            check(r.shape == [len(p) + len(o["tokens"]), 3, 2], "routes shape %s" % r.shape)
            ids = r.tolist()
            wts = o["routing_weights"].tolist()
            for t in range(r.shape[0]):
                for layer in range(3):
                    e = ids[t][layer]
                    check(0 <= e[0] < 8 and 0 <= e[1] < 8 and e[0] != e[1], "ids %s" % e)
                    check(abs(sum(wts[t][layer]) - 1.0) < 1e-5, "weights %s" % wts[t][layer])
            check(all(lp is not None and lp <= 0 for lp in o["logprobs"]), "processed logprobs")
            s = c.score([p], [o["tokens"]], temperature=1.0, top_p=0.9, logprob_mode="processed",
                        prompt_logprobs=True, return_routed_experts=True)[0]
            check(s["logprobs"] == o["logprobs"], "score vs generate logprobs, output %d" % k)
            check(s["routed_experts"].data == r.data, "score vs generate routes, output %d" % k)
            check(s["prompt_logprobs"][0] is None and len(s["prompt_logprobs"]) == len(p),
                  "prompt logprobs")
            check("routing_weights" not in s, "weights only when asked")
        # without prompt logprobs a score reuses the cached prompt blocks (3 of prompt 1's 50)
        s = c.score([prompts[1]], [outs[3]["tokens"]], temperature=1.0, top_p=0.9,
                    logprob_mode="processed")[0]
        check(s["logprobs"] == outs[3]["logprobs"] and s["reused_tokens"] == 48,
              "score on cached blocks: %s" % s)
        st = c.stats()["prefix_cache"]
        check(st["enabled"] and st["forked_samples"] == 4, "stats: %s" % st)
        check(st["hits"] >= 1 and st["tokens_saved"] >= 2 * 7 + 2 * 50 + 48,
              "stats: %s" % st)
        for bad, status in (({"logprob_mode": "nope"}, "invalid_arg"),
                            ({"return_routing_weights": True}, "invalid_arg")):
            try:
                c.generate(prompts[:1], **bad)
                raise AssertionError("accepted %s" % bad)
            except RWError as e:
                check(e.status == status, "%s: %s" % (bad, e))
        try:
            c.score(prompts, [[1]])
            raise AssertionError("accepted 2 prompts with 1 continuation")
        except RWError as e:
            check(e.status == "invalid_arg", "count mismatch: %s" % e)
        c.close()
    print("python rollout client: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
