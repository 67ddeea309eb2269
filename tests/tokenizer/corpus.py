#!/usr/bin/env python3
"""The F6 tokenizer corpus: the files in tests/tokenizer/corpus/ plus two generated texts, written
to one directory so that every tokenizer under test (rw's C tokenizer, the JavaScript reference in
CI, Hugging Face `tokenizers` on the GPU machine) reads the very same bytes.

Generated (deterministic, no dependency beyond the standard library, so the GPU machine's Python
can regenerate it without the C build):
  mix_1mb.txt   about 1 MB of text mixed from the corpus: sentences and lines of every valid file
                shuffled, with words re-drawn and numbers varied, so that the BPE cache sees a
                realistic mix of repeats and new pieces (the speed measurement runs on it);
  fuzz.txt      64 KiB of characters drawn from the corpus's own alphabet plus combining marks,
                whitespace and special tokens, glued without separators to hit odd boundaries.

Usage: corpus.py --write DIR   (prints the names it wrote, one per line)
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
MASK = (1 << 64) - 1


class SplitMix64:
    def __init__(self, seed):
        self.s = seed & MASK

    def next(self):
        self.s = (self.s + 0x9E3779B97F4A7C15) & MASK
        z = self.s
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        return z ^ (z >> 31)

    def below(self, n):
        return self.next() % n


def corpus_files():
    d = os.path.join(HERE, "corpus")
    out = []
    for name in sorted(os.listdir(d)):
        with open(os.path.join(d, name), "rb") as f:
            out.append((name, f.read()))
    return out


# Files the generators do not draw from: unicode_edges.txt holds the characters on which the two
# reference implementations disagree (docs/TOKENIZER.md), kept to that one file;
# long_runs.txt's kilobyte-long pieces would make the 1 MB text unlike any real text.
NOT_MIXED = {"unicode_edges.txt", "long_runs.txt"}


def valid_texts(files):
    texts = []
    for name, data in files:
        if name in NOT_MIXED:
            continue
        try:
            texts.append(data.decode("utf-8"))
        except UnicodeDecodeError:
            pass
    return texts


def gen_mix(files, size=1_000_000, seed=20240601):
    rng = SplitMix64(seed)
    lines = []
    words = []
    for t in valid_texts(files):
        for ln in t.replace("\r\n", "\n").split("\n"):
            if ln.strip() and len(ln) < 2000:
                lines.append(ln)
                words.extend(ln.split())
    seps = [" ", " ", " ", " ", ", ", ". ", "\n", "\n\n", "\t", "  ", " — "]
    parts = []
    total = 0
    while total < size:
        k = rng.below(4)
        if k == 0:  # a corpus line as it is
            s = lines[rng.below(len(lines))]
        elif k == 1:  # a sentence of random words
            s = " ".join(words[rng.below(len(words))] for _ in range(3 + rng.below(20)))
        elif k == 2:  # a number
            s = str(rng.next() % (10 ** (1 + rng.below(12))))
        else:  # a line with one word replaced
            ws = lines[rng.below(len(lines))].split(" ")
            ws[rng.below(len(ws))] = words[rng.below(len(words))]
            s = " ".join(ws)
        s += seps[rng.below(len(seps))]
        parts.append(s)
        total += len(s.encode("utf-8"))
    return "".join(parts).encode("utf-8")


def gen_fuzz(files, size=65536, seed=7):
    rng = SplitMix64(seed)
    alphabet = sorted(set("".join(valid_texts(files))))
    extra = ["\u0301", "\u0308", "\u0323", "\u3099", "\u200d", "\ufe0f", "\u00a0", "\u3000",
             "\r\n", "\n", "\t", " ", "  ", "'s", "'LL", "<|im_start|>", "<|endoftext|>",
             "<think>", "\U0001F3FD", "\u11a8", "\u1161"]
    out = []
    total = 0
    while total < size:
        if rng.below(8) == 0:
            s = extra[rng.below(len(extra))]
        else:
            s = alphabet[rng.below(len(alphabet))] * (1 + (rng.below(16) == 0) * rng.below(40))
        out.append(s)
        total += len(s.encode("utf-8"))
    return "".join(out).encode("utf-8")


def texts():
    """[(name, bytes)] in a fixed order: the corpus files, then the generated texts."""
    files = corpus_files()
    return files + [("fuzz.txt", gen_fuzz(files)), ("mix_1mb.txt", gen_mix(files))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--write", required=True, metavar="DIR")
    a = ap.parse_args()
    os.makedirs(a.write, exist_ok=True)
    for name, data in texts():
        with open(os.path.join(a.write, name), "wb") as f:
            f.write(data)
        print(name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
