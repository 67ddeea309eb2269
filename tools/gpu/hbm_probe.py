#!/usr/bin/env python3
"""hbm_probe.py - does the device-to-device copy rate depend on what else is allocated, or on how
far the copy reaches? rw-bench measures its memory floors against a copy of 2 x 2 GiB; the same
copy read 3.80-3.81 TB/s with a 61 GB model resident and 4.24-4.27 alone on an H200. This probe
times that copy (read + write bytes over the median time, as rw-bench counts them) alone, beside
an untouched and a written ballast of --ballast GiB, inside the ballast at several offsets, over
a span as large as a model, and after the ballast is freed: right after, and every 20 ms after
a second one is freed (--series copies), to see how long the rate stays low. One JSON line per
case.

  python3 tools/gpu/hbm_probe.py [--ballast GIB] [--reps N]
"""
import argparse
import json
import time

import torch


def rate(dst, src, reps):
    """median read + write rate of dst.copy_(src), GB/s"""
    for _ in range(2):
        dst.copy_(src)
    ts = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src)
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) / 1e3)
    ts.sort()
    t = ts[len(ts) // 2]
    return 2.0 * src.numel() * src.element_size() / t / 1e9, t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ballast", type=float, default=61.0, help="GiB held beside the copy")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--series", type=int, default=60, help="copies timed after the last free")
    a = ap.parse_args()
    gib = 1 << 30
    n = 2 * gib // 2  # 2 GiB of bf16, as rw-bench's copy
    dev = torch.device("cuda")
    src = torch.ones(n, dtype=torch.bfloat16, device=dev)
    dst = torch.zeros(n, dtype=torch.bfloat16, device=dev)

    def line(case, gbs_t, **kw):
        gbs, t = gbs_t
        print(json.dumps({"case": case, "gbs": round(gbs, 1), "seconds": t, **kw}), flush=True)

    line("alone", rate(dst, src, a.reps))
    nb = int(a.ballast * gib) // 2
    ballast = torch.empty(nb, dtype=torch.bfloat16, device=dev)
    line("ballast allocated, untouched", rate(dst, src, a.reps), ballast_gib=a.ballast)
    ballast.fill_(1.0)
    torch.cuda.synchronize()
    line("ballast written", rate(dst, src, a.reps), ballast_gib=a.ballast)
    src2 = torch.ones(n, dtype=torch.bfloat16, device=dev)
    dst2 = torch.zeros(n, dtype=torch.bfloat16, device=dev)
    line("buffers allocated after the ballast", rate(dst2, src2, a.reps))
    del src2, dst2
    for off in (0, nb // 4, nb // 2, nb - 2 * n):
        line("inside the ballast", rate(ballast[off + n:off + 2 * n], ballast[off:off + n], a.reps),
             offset_gib=round(off * 2 / gib, 1))
    half = nb // 2
    line("span of the whole ballast", rate(ballast[half:2 * half], ballast[:half], max(3, a.reps // 3)),
         bytes_each_way_gib=round(half * 2 / gib, 1))
    del ballast
    torch.cuda.empty_cache()
    line("ballast freed", rate(dst, src, a.reps))
    # the same copy every 20 ms after a second ballast is freed: how long the rate stays low
    ballast = torch.ones(nb, dtype=torch.bfloat16, device=dev)
    torch.cuda.synchronize()
    line("second ballast written", rate(dst, src, a.reps))
    del ballast
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    t0 = time.perf_counter()
    for _ in range(a.series):
        gbs, t = rate(dst, src, 3)
        line("after the free", (gbs, t), since_free_s=round(time.perf_counter() - t0, 3))
        time.sleep(0.02)


if __name__ == "__main__":
    main()
