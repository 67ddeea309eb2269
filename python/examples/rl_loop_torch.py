#!/usr/bin/env python3
"""rl_loop_torch.py - an RL-style loop against an rw worker, from a PyTorch process that holds
the weights (needs PyTorch: pip install torch; the rest of rw_client needs nothing beyond the
standard library): generate -> (fake) train step -> push the new state_dict -> generate, checking after
every push that the worker holds exactly the trainer's bytes (checksums) and that its outputs
carry the new weight version.

    python3 python/examples/rl_loop_torch.py                  # CUDA: trainer GPU 0, worker GPU 1
    python3 python/examples/rl_loop_torch.py --device cpu     # no GPU: ZeroMQ push, CPU worker

The "training" step adds small noise to one layer's experts (bf16), so every push changes real
bytes. Exits non-zero on any failure.
"""

import argparse
import os
import sys
import time

# the installed package, or the one beside this file in a checkout
sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from rw_client import Client, NcclGroup, Worker, load_safetensors  # noqa: E402
from rw_client.client import _REPO as REPO  # noqa: E402
FIXTURE = os.path.join(REPO, "tests", "fixtures", "qwen3-moe-tiny")


def fake_train_step(torch, state_dict, step, num_layers, gen):
    """Perturbs the experts of one layer in place (what an optimizer step would do)."""
    layer = step % num_layers
    prefix = "model.layers.%d.mlp.experts." % layer
    changed = 0
    for name, t in state_dict.items():
        if name.startswith(prefix):
            noise = torch.randn(t.shape, generator=gen, dtype=torch.float32).to(t.device)
            t.add_((noise * 1e-2).to(t.dtype))
            changed += 1
    return changed


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=["cuda", "cpu"], default=None,
                    help="cuda (NCCL push) or cpu (ZeroMQ push); default cuda when available")
    ap.add_argument("--trainer-gpu", type=int, default=0)
    ap.add_argument("--worker-gpu", type=int, default=1)
    ap.add_argument("--model", default=FIXTURE,
                    help="checkpoint whose weights the trainer starts from (model.safetensors)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--bucket-mb", type=float, default=1.0)
    ap.add_argument("--kv-mb", type=float, default=None,
                    help="the worker's KV cache in MiB (default: its own, on CUDA 0.9 of the "
                         "free device memory; give it when the GPU is shared)")
    args = ap.parse_args(argv)

    import torch
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    config = os.path.join(args.model, "config.json")
    tdev = torch.device("cuda", args.trainer_gpu) if device == "cuda" else torch.device("cpu")
    weights = load_safetensors(os.path.join(args.model, "model.safetensors"), device=tdev)
    num_layers = 1 + max(int(n.split(".")[2]) for n in weights if n.startswith("model.layers."))
    prompts = [[1, 2, 3, 4, 5], [17, 99, 3], [250, 251, 252, 253]]
    gen = torch.Generator().manual_seed(1234)

    wargs = dict(config=config, random_weights=True, device=device, kv_mb=args.kv_mb)
    if device == "cuda":
        wargs["gpu"] = args.worker_gpu
    with Worker(**wargs) as w:
        print("worker ready at %s (%s)" % (w.endpoint, device))
        c = Client(w.endpoint)
        group = NcclGroup([c], device=args.trainer_gpu) if device == "cuda" else None
        bucket = int(args.bucket_mb * (1 << 20))

        def push(version):
            if group:
                s = group.push_state_dict(weights, version=version, bucket_bytes=bucket)
            else:
                t0 = time.time()
                c.push_zmq(weights, version=version, bucket_bytes=bucket)
                s = {"seconds": time.time() - t0}
            n = c.verify_checksums(weights, config)
            print("pushed %s in %.3f s; %d checksums match the trainer's tensors" %
                  (version, s["seconds"], n))

        push("step-0")
        for step in range(1, args.steps + 1):
            outs = c.generate(prompts, max_new_tokens=args.max_new_tokens, temperature=1.0,
                              seed=step)
            for o in outs:
                if o["weight_version"] != "step-%d" % (step - 1):
                    raise RuntimeError("output of version %s, expected step-%d" %
                                       (o["weight_version"], step - 1))
                if len(o["tokens"]) != args.max_new_tokens:
                    raise RuntimeError("short output: %s" % o)
            mean_lp = sum(sum(o["logprobs"]) for o in outs) / sum(len(o["logprobs"]) for o in outs)
            print("step %d: %d samples, mean logprob %.3f, first: %s" %
                  (step, len(outs), mean_lp, outs[0]["tokens"][:8]))
            changed = fake_train_step(torch, weights, step, num_layers, gen)
            print("step %d: train step changed %d tensors" % (step, changed))
            push("step-%d" % step)
        last = c.generate(prompts[:1], max_new_tokens=4)[0]
        if last["weight_version"] != "step-%d" % args.steps:
            raise RuntimeError("final output of version %s" % last["weight_version"])
        print("stats:", c.stats()["weights"])
        if group:
            group.close()
    print("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
