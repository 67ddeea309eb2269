#!/usr/bin/env python3
"""phase_table.py - the per-phase table of docs/BENCHMARKS.md from one run's JSON lines: rw's
per-phase GPU time of a step (rw-bench's breakdown lines, RW_BENCH_BREAKDOWN=1) beside what the
peer kernels take for the same work in the same run (tools/peer/torch_kernels.py for attention
and the expert layer, the cuBLASLt time of rw-bench's dense kernel lines for q/k/v + o_proj and
the lm_head), each peer's per-layer time times the model's layers.

    phase_table.py FILE.jsonl [FILE.jsonl ...] [--layers N | --config CONFIG.json]

Columns: every breakdown line found (decode batch B x context C; prefill P prompts x L tokens),
in the order read. Rows and their peers:
  attention   rw "attention"               torch SDPA on the same shape, the faster backend
                                           (sdpa_decode_BxC; sdpa_prefill_PxL)
  experts     rw "experts"                 torch grouped_mm layer at the step's tokens (B; P*L)
  dense       rw "qkv_gemm" + "o_gemm"     cuBLASLt on dense_qkv_mT + dense_o_proj_mT
  lm_head     rw "lm_head"                 cuBLASLt on dense_lm_head at the rows the step scores
                                           (B for decode, P for prefill: the last token of each)
  other       every other phase (norms, router, q/k norm + RoPE + KV write, embedding, comm)
  forward     rw's forward time (with the profiler's events)
A peer that is not in the files is printed as "not run". The run that makes all of them:

    RW_BENCH_BREAKDOWN=1 rw-bench decode,prefill --batches 1,256 --ctxs 1024 --no-quant > r.jsonl
    rw-bench kernels --kernel-attention d256x1024,d1x1024,p8x2048 --expert-tokens 1,256,16384 \\
        --dense-tokens 1,8,256,16384 > k.jsonl
    tools/peer/torch_kernels.py --kernel-attention d256x1024,d1x1024,p8x2048 \\
        --expert-tokens 1,256,16384 --rw k.jsonl > p.jsonl
    tools/bench/phase_table.py r.jsonl k.jsonl p.jsonl
"""
import argparse
import json
import sys

from jsonl import objects

RW_ROWS = [
    ("attention", ("attention",)),
    ("experts", ("experts",)),
    ("dense (q/k/v + o_proj)", ("qkv_gemm", "o_gemm")),
    ("lm_head", ("lm_head",)),
]


def raw(o):
    """rw-bench wraps its entry's line in "raw"; the peer's lines are flat."""
    r = o.get("raw")
    return r if isinstance(r, dict) else o


def columns(objs):
    """The breakdown lines: [(label, kind, batch, ctx, phases_ms, forward_ms)]."""
    cols = []
    for o in objs:
        r = raw(o)
        kind = {"decode_breakdown": "decode", "prefill_breakdown": "prefill"}.get(r.get("bench"))
        if not kind or not isinstance(r.get("phases_ms"), dict):
            continue
        b, c = int(r["batch"]), int(r["ctx"])
        label = f"decode b{b} x {c}" if kind == "decode" else f"prefill {b} x {c}"
        if r.get("experts") and r["experts"] != "bf16":
            label += f" ({r['experts']})"
        cols.append((label, kind, b, c, r["phases_ms"], float(r.get("forward_ms", 0.0))))
    return cols


def peers(objs):
    """{key: seconds per layer}: ("attn", what) -> the faster torch backend, ("experts", T),
    ("dense", name, T) -> cuBLASLt."""
    p = {}
    for o in objs:
        r = raw(o)
        what = r.get("what", "")
        if o.get("bench") == "peer_kernels" and "seconds" in o and "error" not in o:
            if what.startswith("sdpa_"):
                key = ("attn", what[len("sdpa_"):])
                p[key] = min(p.get(key, float("inf")), float(o["seconds"]))
            elif what.startswith("experts_t"):
                p[("experts", int(o["tokens"]))] = float(o["seconds"])
        elif o.get("bench") == "kernels" and what.startswith("dense_") and "cublaslt_s" in o:
            p[("dense", r.get("what"), int(r.get("tokens", 0)))] = float(o["cublaslt_s"])
    return p


def ms(x):
    return f"{x:.2f} ms" if x >= 0.1 else f"{x * 1000:.0f} us"


OTHER = "other (norms, router, RoPE + KV write, embedding)"
FORWARD = "forward (with the profiler's events)"
ROW_NAMES = [n for n, _ in RW_ROWS] + [OTHER, FORWARD]


def column(kind, b, c, ph, fwd, pk, layers):
    """One step shape's (rw, peer) cells, a pair for each of ROW_NAMES in turn."""
    tok = b if kind == "decode" else b * c
    shape = f"decode_{b}x{c}" if kind == "decode" else f"prefill_{b}x{c}"
    attn = pk.get(("attn", shape))
    exp = pk.get(("experts", tok))
    qkv, o = pk.get(("dense", "dense_qkv", tok)), pk.get(("dense", "dense_o_proj", tok))
    lm = pk.get(("dense", "dense_lm_head", b))
    peer = {
        "attention": (attn * layers * 1e3, "torch SDPA") if attn else None,
        "experts": (exp * layers * 1e3, "torch grouped_mm") if exp else None,
        "dense (q/k/v + o_proj)": ((qkv + o) * layers * 1e3, "cuBLASLt") if qkv and o else None,
        "lm_head": (lm * 1e3, "cuBLASLt") if lm else None,
    }
    cells, used = [], set()
    for name, keys in RW_ROWS:
        used.update(keys)
        pv = peer[name]
        cells.append((ms(sum(float(ph.get(k, 0.0)) for k in keys)),
                      f"{ms(pv[0])} ({pv[1]})" if pv else "not run"))
    cells.append((ms(sum(float(v) for k, v in ph.items() if k not in used)), ""))
    cells.append((ms(fwd), ""))
    return cells


def table(cols, pk, layers):
    head = ["phase"] + [x for c in cols for x in (f"{c[0]}: rw", "peer")]
    per = [column(kind, b, c, ph, fwd, pk, layers) for _, kind, b, c, ph, fwd in cols]
    rows = [head, ["---"] * len(head)]
    rows += [[n] + [x for cells in per for x in cells[i]] for i, n in enumerate(ROW_NAMES)]
    return "\n".join("| " + " | ".join(r) + " |" for r in rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--layers", type=int)
    ap.add_argument("--config", help="a config.json whose num_hidden_layers to use")
    a = ap.parse_args()
    layers = a.layers
    if layers is None and a.config:
        with open(a.config) as f:
            layers = int(json.load(f)["num_hidden_layers"])
    if layers is None:
        layers = 48
    objs = objects(a.files)
    cols = columns(objs)
    if not cols:
        print("phase_table.py: no breakdown lines (run rw-bench with RW_BENCH_BREAKDOWN=1)",
              file=sys.stderr)
        return 1
    print(table(cols, peers(objs), layers))
    return 0


if __name__ == "__main__":
    sys.exit(main())
