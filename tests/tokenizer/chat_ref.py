#!/usr/bin/env python3
"""The reference for rw's Qwen3 chat formatter: renders the conversations of chats.json with the
real chat_template of tokenizer_config.json through Jinja2, set up as transformers'
apply_chat_template sets it up (sandboxed environment, trim_blocks, lstrip_blocks, loopcontrols,
tojson), and compares with (--check) or writes (--write) each case's "expect", which the C test
(test_tokenizer.c) holds rw_tok_chat_qwen3 to.

The JavaScript reference cannot do this: the Jinja engine bundled with @lenml/tokenizers 3.7.2
fails to parse Qwen3's template ("Expected closing statement token").

usage: chat_ref.py --tokenizer DIR [--cases chats.json] (--check | --write)
Exit 77 (skip) when Jinja2 or DIR/tokenizer_config.json is missing.
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def render(template, case, special):
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(msg):
        raise RuntimeError(msg)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    kw = dict(special)
    if "enable_thinking" in case:
        kw["enable_thinking"] = case["enable_thinking"]
    return env.from_string(template).render(
        messages=case["messages"], add_generation_prompt=case.get("add_generation_prompt", False),
        tools=None, documents=None, **kw)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokenizer", required=True, metavar="DIR")
    ap.add_argument("--cases", default=os.path.join(HERE, "chats.json"))
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--check", action="store_true")
    g.add_argument("--write", action="store_true")
    a = ap.parse_args()
    try:
        import jinja2  # noqa: F401
    except ImportError:
        print("skip: Jinja2 is not installed (python3 -m pip install jinja2, or Debian's "
              "python3-jinja2)")
        return 77
    cfg_path = os.path.join(a.tokenizer, "tokenizer_config.json")
    if not os.path.exists(cfg_path):
        print("skip: %s not found (tools/install-deps.sh installs the npm package)" % cfg_path)
        return 77
    with open(cfg_path) as f:
        cfg = json.load(f)
    special = {k: cfg[k] for k in ("bos_token", "eos_token", "pad_token", "unk_token")
               if isinstance(cfg.get(k), str)}
    with open(a.cases) as f:
        doc = json.load(f)
    bad = 0
    for case in doc["cases"]:
        got = render(cfg["chat_template"], case, special)
        if a.write:
            case["expect"] = got
        elif got != case.get("expect"):
            print("%s: Jinja2 renders %r, chats.json expects %r" % (case["name"], got,
                                                                   case.get("expect")))
            bad += 1
    if a.write:
        with open(a.cases, "w") as f:
            json.dump(doc, f, ensure_ascii=False, indent=1)
            f.write("\n")
        print("chat_ref.py: wrote %d cases to %s" % (len(doc["cases"]), a.cases))
        return 0
    print("chat_ref.py: %d passed, %d failed" % (len(doc["cases"]) - bad, bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
