#!/usr/bin/env python3
"""hf_generate.py - the peer of target G5: Hugging Face transformers `generate` on the same
random Qwen3-30B-A3B-shaped model as rw-bench (bf16, random init directly on the GPU, no
checkpoint), the same prompts (rw-bench's rwb_prompt_token formula) and the same lengths. Prints
one JSON line in rw-bench's format (bench "peer", what "generate"); G5 = rw-bench's generate_bf16
tok/s / this tok/s, computed by tools/bench/report.py.

    tools/peer/hf_generate.py [--config tools/configs/qwen3-30b-a3b.json] [--batch 64]
        [--prompt 128] [--new 128] [--reps 2] [--seed 1] [--device cuda:0]
        [--experts-impl NAME] [--attn-impl NAME] [--max-seconds 240]

Timing: one warm-up generate (4 new tokens), then `reps` timed generates, each from the call to a
CUDA synchronize after it; tok/s = batch x new / median time, prefill included (as rw-bench's
generate). Greedy decoding with no end-of-sequence token, so every sequence generates exactly
`new` tokens. Weights: norms 1 + 0.1 N(0,1), everything else
0.02 N(0,1), the distributions rw-bench draws. The model uses the library's default attention and
experts backends unless told otherwise; the line records which ones ran.
"""

import argparse
import datetime
import json
import math
import os
import subprocess
import sys
import time

MASK = (1 << 64) - 1


def prompt_token(seed, seq, pos, vocab):
    """rwb_prompt_token of tools/bench/out.c: splitmix64 of (seed, seq, pos) modulo vocab."""
    z = (seed ^ ((seq & 0xFFFFFFFF) << 32) ^ (pos & 0xFFFFFFFF)) & MASK
    z = (z + 0x9E3779B97F4A7C15) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    z ^= z >> 31
    return z % vocab


def pct(sorted_x, q):
    """Linear interpolation between order statistics (the rule rw-bench uses)."""
    n = len(sorted_x)
    if n == 1:
        return sorted_x[0]
    h = (n - 1) * q
    lo = int(math.floor(h))
    hi = min(lo + 1, n - 1)
    return sorted_x[lo] + (h - lo) * (sorted_x[hi] - sorted_x[lo])


def commit_id(root):
    env = os.environ.get("RW_COMMIT")
    if env:
        return env
    try:
        return subprocess.run(["git", "-C", root, "describe", "--always", "--dirty", "--abbrev=12"],
                              capture_output=True, text=True, timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def emit(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def log(msg):
    print(f"hf_generate: {msg}", file=sys.stderr, flush=True)


def main():
    root = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=os.path.join(root, "tools", "configs", "qwen3-30b-a3b.json"))
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--experts-impl", default=None, help="transformers experts backend (default: the library's)")
    ap.add_argument("--attn-impl", default=None, help="attention backend (default: the library's)")
    ap.add_argument("--layers", type=int, default=0, help="override num_hidden_layers (quick checks only)")
    ap.add_argument("--max-seconds", type=float, default=240.0,
                    help="stop adding timed reps once the next would end past this (from start)")
    ap.add_argument("--note", default=None, help="a remark recorded in the result line")
    ap.add_argument("--print-prompts", action="store_true",
                    help="print the prompts as a JSON array and exit (no torch needed)")
    a = ap.parse_args()

    if a.print_prompts:
        with open(a.config) as f:
            vocab = json.load(f)["vocab_size"]
        emit([[prompt_token(a.seed, b, i, vocab) for i in range(a.prompt)] for b in range(a.batch)])
        return 0

    t_start = time.time()
    base = {"bench": "peer", "what": "generate", "commit": commit_id(root),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "cmd": "hf_generate.py " + " ".join(sys.argv[1:]),
            "batch": a.batch, "prompt": a.prompt, "new": a.new, "gpu": a.device}
    if a.note:
        base["note"] = a.note
    try:
        import torch
        import transformers
        from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

        # synchronize() and memory queries act on the current device: make it the one we use
        torch.cuda.set_device(torch.device(a.device))
        base["device"] = f"{torch.cuda.device_count()}x {torch.cuda.get_device_name(torch.device(a.device))}"
        with open(a.config) as f:
            cfg_d = json.load(f)
        # the hyperparameters only (the keys tests/fixtures' make_fixture.py passes), not file metadata
        keys = ("vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size",
                "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim", "num_experts",
                "num_experts_per_tok", "norm_topk_prob", "rope_theta", "rms_norm_eps",
                "max_position_embeddings", "tie_word_embeddings", "decoder_sparse_step", "mlp_only_layers",
                "attention_bias")
        kw = {k: cfg_d[k] for k in keys if k in cfg_d}
        if a.layers > 0:
            kw["num_hidden_layers"] = a.layers
        cfg = Qwen3MoeConfig(**kw)
        cfg.use_cache = True
        vocab = cfg.vocab_size
        # parameter count the config implies (as rw's weight set counts it), to catch a shape that
        # the library did not take (head_dim, for one, differs from hidden / heads here)
        H, L, V = kw["hidden_size"], kw["num_hidden_layers"], kw["vocab_size"]
        nh, nkv, hd = kw["num_attention_heads"], kw["num_key_value_heads"], kw.get("head_dim", H // kw["num_attention_heads"])
        E, I = kw["num_experts"], kw["moe_intermediate_size"]
        want = (V * H * (1 if kw.get("tie_word_embeddings") else 2) + H
                + L * (nh * hd * H * 2 + nkv * hd * H * 2 + 2 * hd + 2 * H + E * H + E * 3 * I * H))

        torch.manual_seed(a.seed)
        t0 = time.time()
        # built in bf16 directly on the GPU: an fp32 build of 30B parameters would not fit
        torch.set_default_dtype(torch.bfloat16)
        try:
            with torch.device(a.device):
                model = Qwen3MoeForCausalLM(cfg)
        finally:
            torch.set_default_dtype(torch.float32)
        model.eval()
        if a.attn_impl:
            model.set_attn_implementation(a.attn_impl)
        if a.experts_impl:
            model.set_experts_implementation(a.experts_impl)
        # the distributions rw-bench draws: norms 1 + 0.1 N(0, 1), every other weight 0.02 N(0, 1)
        with torch.no_grad():
            for _, p in model.named_parameters():
                if p.dim() == 1:
                    p.normal_(1.0, 0.1)
                else:
                    p.normal_(0.0, 0.02)
        torch.cuda.synchronize()
        nparams = sum(p.numel() for p in model.parameters())
        if model.dtype != torch.bfloat16:
            raise RuntimeError(f"model built as {model.dtype}, not bfloat16")
        if nparams != want:
            raise RuntimeError(f"model has {nparams} parameters, the config implies {want}: a shape differs")
        log(f"model ready in {time.time() - t0:.1f} s: {nparams / 1e9:.2f} B parameters, "
            f"{torch.cuda.memory_allocated() / 1e9:.1f} GB")

        impl = f"transformers {transformers.__version__}, torch {torch.__version__}"
        attn = getattr(model.config, "_attn_implementation", None)
        if attn:
            impl += f", attention {attn}"
        if hasattr(model, "get_experts_implementation"):
            try:
                impl += f", experts {model.get_experts_implementation()}"
            except Exception as e:  # the query is informational only
                impl += f", experts ? ({e})"
        base["impl"] = impl
        base["parameters"] = nparams

        ids = torch.tensor([[prompt_token(a.seed, b, i, vocab) for i in range(a.prompt)] for b in range(a.batch)],
                           dtype=torch.long, device=a.device)
        mask = torch.ones_like(ids)

        def gen(n_new):
            with torch.no_grad():
                out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n_new,
                                     do_sample=False, use_cache=True, pad_token_id=0, eos_token_id=None)
            return out

        torch.cuda.synchronize()
        t0 = time.time()
        gen(min(4, a.new))
        torch.cuda.synchronize()
        log(f"warm-up (prefill + {min(4, a.new)} tokens) {time.time() - t0:.1f} s")

        times = []
        for r in range(a.reps):
            torch.cuda.synchronize()
            t0 = time.time()
            out = gen(a.new)
            torch.cuda.synchronize()
            dt = time.time() - t0
            if out.shape[1] != a.prompt + a.new:
                raise RuntimeError(f"generate returned {out.shape[1]} positions, expected {a.prompt + a.new}")
            times.append(dt)
            log(f"rep {r + 1}/{a.reps}: {dt:.2f} s, {a.batch * a.new / dt:.1f} tok/s")
            if time.time() + dt > t_start + a.max_seconds and r + 1 < a.reps:
                log(f"stopping after {r + 1} reps: the next would pass --max-seconds {a.max_seconds:.0f}")
                break
        s = sorted(times)
        med = pct(s, 0.5)
        base.update({"tokens": a.batch * a.new, "median_s": med, "p10_s": pct(s, 0.1), "p90_s": pct(s, 0.9),
                     "min_s": s[0], "max_s": s[-1], "reps": len(s), "achieved": a.batch * a.new / med,
                     "unit": "tok/s", "ceiling": None, "ratio": None,
                     "ceiling_what": "none: the peer is the reference G5 divides by"})
        if a.layers > 0:
            base["layers_override"] = a.layers
        emit(base)
        return 0
    except Exception as e:  # one error line, like rw-bench's
        base["error"] = f"{type(e).__name__}: {e}"
        base.setdefault("device", "unknown")
        emit(base)
        log(f"failed: {base['error']}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
