#!/usr/bin/env python3
"""test_prompts.py - rw-bench and the peer (tools/peer/hf_generate.py) must generate from the same
prompts for G5 to compare like with like: both print them, the arrays must be equal.
    test_prompts.py RW_BENCH HF_GENERATE_PY
"""
import json
import subprocess
import sys

rw_bench, peer = sys.argv[1], sys.argv[2]
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
sys.exit(0 if ok else 1)
