#!/usr/bin/env python3
"""test_prompts.py - rw-bench and its peers must work on the same inputs to compare like with like:
the prompts of G5 (tools/peer/hf_generate.py) and the expert routing of G7
(tools/peer/torch_kernels.py). Each side prints them; the arrays must be equal.
    test_prompts.py RW_BENCH HF_GENERATE_PY TORCH_KERNELS_PY
"""
import json
import subprocess
import sys

rw_bench, peer, kpeer = sys.argv[1], sys.argv[2], sys.argv[3]
ok = True
for seed, b, p in ((1, 64, 128), (7, 3, 5)):
    a = subprocess.run([rw_bench, "--print-prompts", "--gen", f"{b},{p},1", "--seed", str(seed)],
                       capture_output=True, text=True, check=True).stdout
    c = subprocess.run([sys.executable, peer, "--print-prompts", "--batch", str(b), "--prompt", str(p),
                        "--seed", str(seed)], capture_output=True, text=True, check=True).stdout
    x, y = json.loads(a), json.loads(c)
    same = x == y and len(x) == b and all(len(r) == p for r in x)
    print(f"seed {seed}, {b} x {p}: {'same' if same else 'DIFFERENT'}")
    ok &= same
for seed, t in ((1, 300), (9, 7)):
    a = subprocess.run([rw_bench, "--print-routing", str(t), "--seed", str(seed)],
                       capture_output=True, text=True, check=True).stdout
    c = subprocess.run([sys.executable, kpeer, "--print-routing", str(t), "--seed", str(seed)],
                       capture_output=True, text=True, check=True).stdout
    x, y = json.loads(a), json.loads(c)
    distinct = all(len(set(r)) == len(r) == 8 for r in x)
    same = x == y and len(x) == t and distinct
    print(f"routing seed {seed}, {t} tokens: {'same' if same else 'DIFFERENT'}")
    ok &= same
sys.exit(0 if ok else 1)
