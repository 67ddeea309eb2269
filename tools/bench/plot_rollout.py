#!/usr/bin/env python3
"""plot_rollout.py - the PNG of `rw-bench rollout` (R1, docs/TARGETS.md): sequences in flight
(running, and waiting for admission), KV tokens held, and generated tokens per second over time,
one curve per run (prefix sharing on and off), from rw-bench's JSON lines.

    tools/bench/plot_rollout.py rollout.jsonl [more.jsonl ...] -o docs/rollout_r1.png
    tools/bench/plot_rollout.py rollout.jsonl --summary     # the numbers only, no matplotlib

Needs matplotlib for the PNG (the GPU machine has it)."""

import argparse
import sys

from jsonl import objects


def runs(paths):
    """The rollout lines that carry a time series, in file order."""
    return [j for j in objects(paths)
            if j.get("bench") == "rollout" and isinstance(j.get("series"), dict)]


def label(j):
    return "sharing %s: %.0f s, %.0f tok/s, R1 ratio %.3f" % (
        j.get("sharing", "?"), j.get("wall_s", 0), j.get("tok_per_s", 0), j.get("ratio") or 0)


def summary(rs):
    for j in rs:
        print("%-20s wall %8.1f s  %9.0f tok/s  tail %7.1f s  prefill %9d  KV peak %6.2f GiB  "
              "floor sum %8.1f s  ratio %.3f%s" % (
                  j["what"], j["wall_s"], j["tok_per_s"], j["tail_s"], j["prefill_tokens"],
                  j["kv_used_gib"], j["floor_sum_s"], j.get("ratio") or 0,
                  "  (%s)" % j["warning"] if "warning" in j else ""))


def plot(rs, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(3, 1, figsize=(10, 10), sharex=True)
    for j in rs:
        s = j["series"]
        t = s["t_s"]
        lab = label(j)
        ax[0].plot(t, s["running"], label=lab)
        ax[0].plot(t, s["waiting"], linestyle=":", color=ax[0].lines[-1].get_color())
        ax[1].plot(t, [k / 1e6 for k in s["kv_tokens"]], label=lab)
        ax[2].plot(t, s["tok_per_s"], label=lab)
    first = rs[0]
    ax[0].set_ylabel("sequences\n(running; dotted: waiting)")
    ax[1].set_ylabel("KV tokens held (M)")
    ax[2].set_ylabel("generated tok/s")
    ax[2].set_xlabel("seconds since the first request")
    for a in ax:
        a.grid(alpha=0.3)
    ax[2].legend(loc="upper right", fontsize=8)
    fig.suptitle("R1 rollout: %d prompts x %d, prompts %d-%d tokens, responses log-normal "
                 "median %d (cap %d)\n%s, commit %s" % (
                     first["prompts"], first["samples"], first["prompt_len_min"],
                     first["prompt_len_max"], first["response_median"], first["response_cap"],
                     first.get("device", ""), first.get("commit", "")), fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print("wrote", out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("jsonl", nargs="+", help="rw-bench output (JSON lines)")
    ap.add_argument("-o", "--out", default="rollout_r1.png", help="PNG to write")
    ap.add_argument("--summary", action="store_true", help="print the numbers, no plot")
    a = ap.parse_args()
    rs = runs(a.jsonl)
    if not rs:
        print("no rollout lines with a time series in", " ".join(a.jsonl), file=sys.stderr)
        return 1
    summary(rs)
    if not a.summary:
        plot(rs, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
