#!/usr/bin/env python3
"""test_metrics.py - GET /metrics of rw-worker: after a weight push and some generations, the
text is checked against the Prometheus text exposition format (version 0.0.4) by the parser
below - names, labels and their escapes, one HELP and TYPE per family before its samples,
contiguous families, counters named _total and nothing else, histograms with ascending `le`,
cumulative buckets, a +Inf bucket equal to _count, a _sum - and its numbers against what
happened (one update of the fixture's bytes, the requests and tokens made, the version served).
With --promtool the same text goes to `promtool check metrics` (Debian package prometheus; exit
77 when it is not installed)."""

import math
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import http_util  # noqa: E402
from http_util import Checks, Worker  # noqa: E402

NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\\\|\\"|\\n)*)"')
TYPES = {"counter", "gauge", "histogram", "summary", "untyped"}


def value(s):
    if s in ("+Inf", "Inf"):
        return math.inf
    if s == "-Inf":
        return -math.inf
    if s == "NaN":
        return math.nan
    return float(s)


def parse(text):
    """{family: {"type", "help", "samples": [(name, {labels}, value)]}}; raises ValueError naming
    the line that breaks the format."""
    if not text.endswith("\n"):
        raise ValueError("the text does not end with a newline")
    fams, order, current = {}, [], None
    for no, line in enumerate(text[:-1].split("\n"), 1):
        where = "line %d: %r" % (no, line)
        if not line:
            continue
        if line.startswith("#"):
            parts = line.split(" ", 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                name = parts[2]
                if not NAME.match(name):
                    raise ValueError("%s: bad metric name" % where)
                f = fams.setdefault(name, {"type": None, "help": None, "samples": []})
                if f["samples"]:
                    raise ValueError("%s: %s after the family's samples" % (where, parts[1]))
                key = parts[1].lower()
                if f[key] is not None:
                    raise ValueError("%s: a second %s for %s" % (where, parts[1], name))
                f[key] = parts[3] if len(parts) > 3 else ""
                if key == "type" and f["type"] not in TYPES:
                    raise ValueError("%s: unknown type" % where)
                if name not in order:
                    order.append(name)
                current = name
            continue
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)( -?\d+)?$", line)
        if not m:
            raise ValueError("%s: not a sample line" % where)
        name, labels = m.group(1), {}
        if m.group(3):
            rest = m.group(3)
            while rest:
                lm = LABEL.match(rest)
                if not lm:
                    raise ValueError("%s: bad label syntax at %r" % (where, rest))
                if lm.group(1) in labels:
                    raise ValueError("%s: label %s twice" % (where, lm.group(1)))
                labels[lm.group(1)] = lm.group(2)
                rest = rest[lm.end():]
                if rest.startswith(","):
                    rest = rest[1:]
                elif rest:
                    raise ValueError("%s: expected ',' between labels" % where)
        try:
            v = value(m.group(4))
        except ValueError:
            raise ValueError("%s: value %r is not a number" % (where, m.group(4)))
        fam = name
        for suffix in ("_bucket", "_sum", "_count"):
            if name.endswith(suffix) and name[:-len(suffix)] in fams and \
                    fams[name[:-len(suffix)]]["type"] == "histogram":
                fam = name[:-len(suffix)]
        if fam != current:
            raise ValueError("%s: sample of %s outside its family (families must be contiguous, "
                             "HELP/TYPE first)" % (where, fam))
        fams[fam]["samples"].append((name, labels, v))
    for name, f in fams.items():
        if f["type"] is None:
            raise ValueError("%s: no TYPE" % name)
        if (f["type"] == "counter") != name.endswith("_total"):
            raise ValueError("%s: counters, and only counters, end in _total" % name)
        if f["type"] == "histogram":
            buckets = [(s[1].get("le"), s[2]) for s in f["samples"] if s[0] == name + "_bucket"]
            les = [value(le) for le, _ in buckets]
            if not buckets or les[-1] != math.inf:
                raise ValueError("%s: no +Inf bucket last" % name)
            if les != sorted(les) or len(set(les)) != len(les):
                raise ValueError("%s: bucket bounds not ascending" % name)
            counts = [c for _, c in buckets]
            if counts != sorted(counts):
                raise ValueError("%s: bucket counts not cumulative" % name)
            total = [s[2] for s in f["samples"] if s[0] == name + "_count"]
            sums = [s for s in f["samples"] if s[0] == name + "_sum"]
            if len(total) != 1 or len(sums) != 1 or total[0] != counts[-1]:
                raise ValueError("%s: _count must equal the +Inf bucket, one _sum" % name)
    return fams


def one(fams, name, labels=None):
    """The value of sample `name` (with exactly `labels`), or None."""
    for f in fams.values():
        for s in f["samples"]:
            if s[0] == name and (labels is None or s[1] == labels):
                return s[2]
    return None


def main():
    promtool = "--promtool" in sys.argv
    if promtool and not shutil.which("promtool"):
        print("skip: promtool is not installed (Debian package prometheus)")
        return 77
    http_util.needs(http_util.TOKDIR)
    ok = Checks()
    ref = http_util.reference()
    w = Worker("--tokenizer", http_util.TOKDIR)
    try:
        w.push_fixture("v1")
        ntok = 0
        for i in range(4):
            st, _, r = w.request("POST", "/generate", {
                "input_ids": ref["prompts"][i],
                "sampling_params": {"temperature": 0, "max_new_tokens": 24}})
            ok(st == 200 and r["output_ids"] == ref["greedy"][i], "generate %d exact" % i)
            ntok += 24
        st, hdr, text = w.request("GET", "/metrics")
        ok(st == 200 and hdr.get("Content-Type", "").startswith("text/plain; version=0.0.4"),
           "GET /metrics: 200, text/plain; version=0.0.4")
        if promtool:
            p = subprocess.run(["promtool", "check", "metrics"], input=text, text=True,
                               capture_output=True)
            ok(p.returncode == 0, "promtool check metrics: rc %d %s%s" % (p.returncode, p.stdout,
                                                                        p.stderr))
        try:
            fams = parse(text)
            ok(True, "the text exposition format (%d families)" % len(fams))
        except ValueError as e:
            ok(False, "format: %s" % e)
            return ok.done()
        ok(one(fams, "rw_weight_updates_total") == 1, "one committed update")
        ok(one(fams, "rw_weight_update_duration_seconds_count") == 1, "update duration observed")
        size = os.path.getsize(os.path.join(http_util.FIXTURE, "model.safetensors"))
        ub = one(fams, "rw_weight_update_bytes_total")
        ok(ub is not None and 0.9 * size < ub <= size, "update bytes %s of a %d-byte file" % (ub, size))
        ok(one(fams, "rw_weight_version_info", {"version": "v1"}) == 1, "version label v1")
        ok(one(fams, "rw_worker_state", {"state": "serving"}) == 1, "state serving")
        ok(one(fams, "rw_generation_tokens_total") >= ntok, "generated tokens >= %d" % ntok)
        ok(one(fams, "rw_prompt_tokens_total") >= sum(len(p) for p in ref["prompts"]),
           "prompt tokens")
        ok(one(fams, "rw_time_to_first_token_seconds_count") >= 4, "TTFT observed per request")
        ok(one(fams, "rw_inter_token_latency_seconds_count") >= 4 * 23, "one ITL per gap")
        ok(one(fams, "rw_e2e_request_latency_seconds_count") >= 4, "e2e observed")
        ok(one(fams, "rw_num_requests_running") == 0 and one(fams, "rw_num_requests_waiting") == 0,
           "nothing running or waiting")
        u = one(fams, "rw_kv_cache_usage_ratio")
        ok(u is not None and 0 <= u <= 1, "KV usage ratio in [0, 1]")
        # label values escape what the format needs escaped
        bad = 'a"b\\c\nd'
        ok(parse('# HELP x y\n# TYPE x gauge\nx{v="%s"} 1\n' % bad.replace("\\", "\\\\")
                 .replace('"', '\\"').replace("\n", "\\n"))["x"]["samples"][0][1]["v"]
           == 'a\\"b\\\\c\\nd', "the checker reads escaped label values")
        for broken in ["x 1\n", "# TYPE x gauge\nx{a=b} 1\n", "# TYPE x_total gauge\nx_total 1\n",
                       "# TYPE x gauge\nx 1", "# TYPE h histogram\nh_bucket{le=\"1\"} 2\n"
                       "h_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 1\n"]:
            try:
                parse(broken)
                ok(False, "the checker refuses %r" % broken)
            except ValueError:
                ok(True, "the checker refuses %r" % broken[:30])
    finally:
        code = w.stop()
    ok(code == 0, "worker exit 0")
    return ok.done()


if __name__ == "__main__":
    sys.exit(main())
