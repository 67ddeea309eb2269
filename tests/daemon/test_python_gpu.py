#!/usr/bin/env python3
"""test_python_gpu.py - the Python client drives a CUDA worker end to end from a process that
holds torch tensors on its own GPU: python/examples/rl_loop_torch.py (NCCL pushes of a
state_dict from GPU 0 into a worker on GPU 1, checksums verified after every push, outputs
stamped with each pushed version). Exits 77 (skip) without a CUDA build of rw, without torch,
or with fewer than 2 GPUs. Argument 1: "1" when rw was built with CUDA."""

import os
import sys

ROOT = os.environ.get("RW_SOURCE_ROOT", os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "python", "examples"))


def main():
    if len(sys.argv) > 1 and sys.argv[1] != "1":
        print("skip: rw was built without CUDA")
        return 77
    try:
        import torch
    except ImportError:
        print("skip: no torch")
        return 77
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        print("skip: needs 2 CUDA devices")
        return 77
    import rl_loop_torch as example_rl_loop
    # a small KV cache: the gpu tests run side by side on the same GPUs
    return example_rl_loop.main(["--device", "cuda", "--trainer-gpu", "0", "--worker-gpu", "1",
                                 "--steps", "3", "--bucket-mb", "0.5", "--kv-mb", "64"])


if __name__ == "__main__":
    sys.exit(main())
