#!/usr/bin/env python3
"""torch_kernels.py - the peer of targets G6 and G7: torch's attention (SDPA, cuDNN and flash
backends) and torch's grouped GEMM (grouped_mm) on the shapes and routing of `rw-bench kernels`,
timed the same way, in the same run. Prints one JSON line per measurement (bench "peer_kernels",
so tools/bench/report.py does not take them for G5's peer); with --rw FILE (rw-bench's kernels
lines of this run) also one line per target point (bench "compare") with the ratio and the
verdict.

    tools/peer/torch_kernels.py [--config tools/configs/qwen3-30b-a3b.json] [--seed 1]
        [--kernel-attention d256x1024,d32x8192,d1x1024,p8x2048]
        [--expert-tokens 1,16,64,256,2048,16384]
        [--kernel-layers 4] [--device cuda:0] [--rw RW_KERNELS.jsonl] [--print-routing T]

Attention. Decode dSxK: S sequences, one query each attending K keys; the 8 query heads of a KV
group are passed as 8 query rows of that group (q [S, 4, 8, 128] against k, v [S, 4, K, 128]),
which is exactly decode GQA and reads each KV head once. Prefill pSxK: S causal prompts of K
tokens, q [S, 32, K, 128], k, v [S, 4, K, 128] with enable_gqa (or, where a backend refuses it,
K and V repeated to 32 heads; the line says which). Decode is judged by the KV bytes per second,
prefill by TFLOP/s over the causal triangle, counting QK^T and PV once (rw-bench's formulas).

Experts. A whole MoE layer from x [T, H] and the routing of rw-bench (rwb_route_expert: expert j
of token t is the first of splitmix(seed ^ splitmix(t * 1024 + c)) % E, c = 0, 1, ..., not already
chosen): a stable sort of the assignments by expert, the gather of x, grouped_mm with the gate/up
weights, SiLU(gate) * up, grouped_mm with the down weights, the routing weights and a scatter-add
into the output. rw's time covers the same steps (sort, both GEMMs, combine). Repetitions rotate
over --kernel-layers weight sets, as rw-bench does, so the touched experts do not stay in L2.

Timing: CUDA events around groups of calls (about 20 ms each) after 2 warm-up calls; the median
of 5 groups.
"""

import argparse
import datetime
import json
import os
import sys

MASK = (1 << 64) - 1


def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def routing(seed, tokens, E, k):
    """rw-bench's rwb_route_expert for every token: k distinct experts, uniform."""
    out = []
    for t in range(tokens):
        row = []
        c = 0
        while len(row) < k:
            e = splitmix64(seed ^ splitmix64(t * 1024 + c)) % E
            c += 1
            if e not in row:
                row.append(e)
        out.append(row)
    return out


def parse_shapes(s):
    shapes = []
    for t in s.split(","):
        kind, rest = t[0], t[1:]
        seqs, kv = rest.split("x")
        if kind not in "dp":
            raise ValueError(f"attention shape {t}: starts with d or p")
        shapes.append((kind == "p", int(seqs), int(kv)))
    return shapes


def emit(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def log(msg):
    print(f"torch_kernels: {msg}", file=sys.stderr, flush=True)


def time_fn(torch, fn):
    """Median seconds per call over 5 groups of ~20 ms, after 2 warm-up calls."""
    for i in range(2):
        fn(i)
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    fn(2)
    b.record()
    b.synchronize()
    ms = a.elapsed_time(b)
    n = max(3, min(200, int(20.0 / ms) if ms > 0 else 200))
    groups, rep = [], 3
    for _ in range(5):
        a.record()
        for _ in range(n):
            fn(rep)
            rep += 1
        b.record()
        b.synchronize()
        groups.append(a.elapsed_time(b) * 1e-3 / n)
    groups.sort()
    return groups[2]


def sdpa_lines(torch, shape, nh, nkv, hd, dev, base, emit):
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    prefill, S, K = shape
    g = torch.Generator(device=dev).manual_seed(1234)
    kv_bytes = S * K * nkv * hd * 2 * 2
    flop = 4.0 * S * (K * (K + 1) / 2) * nh * hd
    k = torch.randn(S, nkv, K, hd, device=dev, dtype=torch.bfloat16, generator=g)
    v = torch.randn(S, nkv, K, hd, device=dev, dtype=torch.bfloat16, generator=g)
    if prefill:
        q = torch.randn(S, nh, K, hd, device=dev, dtype=torch.bfloat16, generator=g)
    else:
        q = torch.randn(S, nkv, nh // nkv, hd, device=dev, dtype=torch.bfloat16, generator=g)
    name = f"sdpa_{'prefill' if prefill else 'decode'}_{S}x{K}"
    for backend, bname in ((SDPBackend.CUDNN_ATTENTION, "cudnn"), (SDPBackend.FLASH_ATTENTION, "flash")):
        line = dict(base, what=name, backend=bname, seqs=S, kv=K, heads=nh, kv_heads=nkv, head_dim=hd)
        try:
            with sdpa_kernel([backend]):
                if prefill:
                    gqa = "enable_gqa"
                    try:
                        F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
                        torch.cuda.synchronize()
                        fn = lambda i: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
                    except RuntimeError:
                        gqa = "repeated"
                        kr = k.repeat_interleave(nh // nkv, dim=1)
                        vr = v.repeat_interleave(nh // nkv, dim=1)
                        fn = lambda i: F.scaled_dot_product_attention(q, kr, vr, is_causal=True)
                    line["gqa"] = gqa
                else:
                    line["gqa"] = "query heads of a group as query rows"
                    fn = lambda i: F.scaled_dot_product_attention(q, k, v)
                sec = time_fn(torch, fn)
            line["seconds"] = sec
            if prefill:
                line.update(flop=flop, tflops=flop / sec / 1e12, unit="TFLOP/s", achieved=flop / sec / 1e12)
            else:
                line.update(bytes=kv_bytes, gbs=kv_bytes / sec / 1e9, unit="GB/s", achieved=kv_bytes / sec / 1e9)
        except Exception as e:  # a backend that cannot run the shape: say so, go on
            line["error"] = f"{type(e).__name__}: {e}"[:300]
        emit(line)
        log(f"{name} {bname}: " + (f"{line['seconds'] * 1e6:.1f} us" if "seconds" in line else line["error"]))


def grouped_mm_fn(torch):
    import torch.nn.functional as F
    fn = getattr(F, "grouped_mm", None)
    if fn is not None:
        return fn, "torch.nn.functional.grouped_mm"
    fn = getattr(torch, "_grouped_mm", None)
    if fn is not None:
        return fn, "torch._grouped_mm"
    return None, None


def experts_lines(torch, T, cfg, layers, seed, dev, base, weights, emit):
    gmm, gname = grouped_mm_fn(torch)
    E, k, H, P = cfg["num_experts"], cfg["num_experts_per_tok"], cfg["hidden_size"], cfg["moe_intermediate_size"]
    line = dict(base, what=f"experts_t{T}", tokens=T, top_k=k, experts=E, hidden=H, intermediate=P,
                weight_layers=layers, route_seed=seed, impl=gname)
    if gmm is None:
        line["error"] = "this torch has no grouped_mm"
        emit(line)
        return
    ids = torch.tensor(routing(seed, T, E, k), dtype=torch.int64, device=dev)
    touched = int(torch.unique(ids).numel())
    g = torch.Generator(device=dev).manual_seed(99)
    x = torch.randn(T, H, device=dev, dtype=torch.bfloat16, generator=g)
    wts = torch.full((T, k), 1.0 / k, device=dev, dtype=torch.float32)
    w13, w2 = weights

    def layer(i, gemm_only=False):
        a, b = w13[i % layers], w2[i % layers]
        flat = ids.view(-1)
        order = torch.argsort(flat, stable=True)
        offs = torch.cumsum(torch.bincount(flat, minlength=E), 0).to(torch.int32)
        src = order // k
        xs = x.index_select(0, src)
        h = gmm(xs, a.transpose(-2, -1), offs=offs)
        act = torch.nn.functional.silu(h[:, :P]) * h[:, P:]
        o = gmm(act, b.transpose(-2, -1), offs=offs)
        o = o.float() * wts.view(-1).index_select(0, order).unsqueeze(1)
        return torch.zeros(T, H, device=dev, dtype=torch.float32).index_add_(0, src, o)

    try:
        sec = time_fn(torch, layer)
        per_expert = (2 * P * H + H * P) * 2
        byt = per_expert * touched
        flop = 2.0 * T * k * 3 * P * H
        line.update(seconds=sec, experts_touched=touched, bytes=byt, gbs=byt / sec / 1e9, flop=flop,
                    tflops=flop / sec / 1e12, unit="GB/s", achieved=byt / sec / 1e9)
    except Exception as e:
        line["error"] = f"{type(e).__name__}: {e}"[:300]
    emit(line)
    log(f"experts {T} tokens: " + (f"{line['seconds'] * 1e6:.1f} us" if "seconds" in line else line["error"]))


def compare(rw_path, peer_lines, base, emit):
    """G6 / G7 from rw-bench's kernels lines of this run and the peer lines just measured."""
    rw = {}  # what -> (its raw result, whether rw-bench gave the line a G6 target)
    with open(rw_path) as f:
        for ln in f:
            try:
                o = json.loads(ln)
            except ValueError:
                continue
            if o.get("bench") == "kernels" and "error" not in o and isinstance(o.get("raw"), dict):
                rw[o["what"]] = (o["raw"], o.get("target_id") == "G6/rw")
    by = {}
    for p in peer_lines:
        if "seconds" in p:
            cur = by.get(p["what"])
            if cur is None or p["seconds"] < cur["seconds"]:
                by[p["what"]] = p
    for what, p in sorted(by.items()):
        if what.startswith("sdpa_"):
            rname = f"attention_{what.split('_')[1]}_{p['seqs']}x{p['kv']}"
            if rname not in rw:
                continue
            # G6's points are the shapes rw-bench gave a target (docs/TARGETS.md); others (the
            # batch-1 point) are compared without one
            r, g6 = rw[rname]
            ratio = p["seconds"] / r["seconds"]
            need = 0.9
            emit(dict(base, bench="compare", what=rname, target_id="G6" if g6 else None,
                      target=f"rw >= {need} x the faster torch backend" if g6 else "none at this shape",
                      rw_seconds=r["seconds"], peer_seconds=p["seconds"], peer_backend=p["backend"],
                      ratio=ratio, met=ratio >= need if g6 else None))
        elif what.startswith("experts_t"):
            T = p["tokens"]
            need = 1.5 if T <= 256 else 1.0
            for rname, tid, rw_input in ((f"experts_t{T}", "G7", "hi + lo pair (as the engine runs)"),
                                         (f"experts_bf16_input_t{T}", None, "bf16")):
                if rname not in rw:
                    continue
                r = rw[rname][0]
                ratio = p["seconds"] / r["seconds"]
                emit(dict(base, bench="compare", what=rname, target_id=tid,
                          target=f"rw >= {need} x torch grouped_mm", rw_seconds=r["seconds"],
                          peer_seconds=p["seconds"], ratio=ratio, met=ratio >= need, rw_input=rw_input))


def main():
    root = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=os.path.join(root, "tools", "configs", "qwen3-30b-a3b.json"))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--kernel-attention", default="d256x1024,d32x8192,d1x1024,p8x2048")
    ap.add_argument("--expert-tokens", default="1,16,64,256,2048,16384")
    ap.add_argument("--kernel-layers", type=int, default=4)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--rw", default=None, help="rw-bench kernels lines of this run: also print G6 / G7")
    ap.add_argument("--print-routing", type=int, default=0,
                    help="print the routing of T tokens as JSON and exit (no torch needed)")
    a = ap.parse_args()
    with open(a.config) as f:
        cfg = json.load(f)
    for alias in ("n_routed_experts", "num_local_experts"):  # the config's spelling of E
        if "num_experts" not in cfg and alias in cfg:
            cfg["num_experts"] = cfg[alias]
    if a.print_routing:
        emit(routing(a.seed, a.print_routing, cfg["num_experts"], cfg["num_experts_per_tok"]))
        return 0

    import torch
    dev = torch.device(a.device)
    torch.cuda.set_device(dev)
    base = {"bench": "peer_kernels", "commit": os.environ.get("RW_COMMIT", "unknown"),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "cmd": "torch_kernels.py " + " ".join(sys.argv[1:]), "torch": torch.__version__,
            "device": torch.cuda.get_device_name(dev)}
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim", cfg["hidden_size"] // nh)
    out = []

    def keep(o):
        out.append(o)
        emit(o)
    for shape in parse_shapes(a.kernel_attention):
        sdpa_lines(torch, shape, nh, nkv, hd, dev, base, keep)
        torch.cuda.empty_cache()
    E, H, P = cfg["num_experts"], cfg["hidden_size"], cfg["moe_intermediate_size"]
    g = torch.Generator(device=dev).manual_seed(7)
    w13 = [torch.randn(E, 2 * P, H, device=dev, dtype=torch.bfloat16, generator=g) * 0.02
           for _ in range(a.kernel_layers)]
    w2 = [torch.randn(E, H, P, device=dev, dtype=torch.bfloat16, generator=g) * 0.02
          for _ in range(a.kernel_layers)]
    for T in (int(t) for t in a.expert_tokens.split(",")):
        experts_lines(torch, T, cfg, a.kernel_layers, a.seed, dev, base, (w13, w2), keep)
    if a.rw:
        compare(a.rw, out, base, emit)
    return 0


if __name__ == "__main__":
    sys.exit(main())
