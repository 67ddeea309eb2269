#!/usr/bin/env python3
"""test_bad_input.py - bad HTTP input against a live rw-worker (--http, a bearer token, a 2 s idle
timeout), each answered with a clear 4xx naming what was wrong, while the worker stays exact:
unknown paths and methods, missing / wrong / malformed tokens, malformed JSON, bodies that are
not objects, invalid UTF-8, deep nesting, wrong types and out-of-range values in every route's
fields (SGLang and OpenAI), unknown fields, bodies over the limit (announced by Content-Length,
and streamed chunked without one), slow clients (headers or body never finished: closed after
the idle timeout while other clients are served), more idle connections than the limit, and
clients that leave in the middle of a generation (their requests are aborted). Afterwards every
tensor's checksum is what it was and the fixture's greedy reference comes back over HTTP and
ZeroMQ alike."""

import os
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import http_util  # noqa: E402
from http_util import Checks, Worker  # noqa: E402

TOKEN = "bad-input-token"


def raw(w, data, read=True, timeout=10):
    """Sends raw bytes on a fresh connection; returns what came back (until close or timeout)."""
    s = socket.create_connection((w.host, w.port), timeout=timeout)
    s.sendall(data)
    out = b""
    if read:
        try:
            while True:
                b = s.recv(65536)
                if not b:
                    break
                out += b
                if b"\r\n\r\n" in out and b"Content-Length" in out:
                    head, _, body = out.partition(b"\r\n\r\n")
                    n = int([ln.split(b":")[1] for ln in head.split(b"\r\n")
                             if ln.lower().startswith(b"content-length")][0])
                    if len(body) >= n:
                        break
        except socket.timeout:
            pass
    s.close()
    return out


def status_of(resp):
    try:
        return int(resp.split(b" ", 2)[1])
    except (IndexError, ValueError):
        return None


def main():
    http_util.needs(http_util.TOKDIR)
    ok = Checks()
    ref = http_util.reference()
    w = Worker("--tokenizer", http_util.TOKDIR, "--http-timeout", "2", token=TOKEN)
    try:
        w.push_fixture("v1")
        sums0 = w.ctl("checksum")

        def err(method, path, body=None, want=400, has=None, headers=None, raw_body=None):
            st, _, r = w.request(method, path, body, headers=headers, raw=raw_body)
            msg = r.get("error", {}).get("message", "") if isinstance(r, dict) else str(r)
            good = st == want and (has is None or has in msg)
            ok(good, "%s %s -> %d %s%s" % (method, path, st, msg[:90],
                                           "" if good else "  (wanted %d, '%s')" % (want, has)))

        # --- paths, methods, tokens -----------------------------------------------------------
        err("GET", "/nope", want=404, has="unknown path '/nope'")
        err("GET", "/v1/nope", want=404, has="unknown path")
        err("GET", "/generate", want=405, has="method not allowed")
        err("DELETE", "/v1/completions", want=405)
        err("GET", "/get_weight_version", want=401, headers={"Authorization": ""},
            has="authentication failed")
        err("GET", "/get_weight_version", want=401, headers={"Authorization": "Bearer " + TOKEN[:-1]})
        err("GET", "/get_weight_version", want=401, headers={"Authorization": "Basic " + TOKEN})
        err("POST", "/generate", {"input_ids": [1]}, want=401,
            headers={"Authorization": "Bearer " + TOKEN + TOKEN})
        # --- bodies -----------------------------------------------------------------------------
        err("POST", "/generate", raw_body="{\"input_ids\": [1, 2", has="malformed JSON")
        err("POST", "/generate", raw_body="", has="empty")
        err("POST", "/generate", raw_body="[1, 2, 3]", has="expected a JSON object")
        err("POST", "/generate", raw_body=b'{"text": "\xff\xfe"}', has="malformed JSON")
        err("POST", "/generate", raw_body='{"input_ids": [1], "input_ids": [2]}', has="malformed JSON")
        err("POST", "/v1/completions", raw_body='{"prompt": ' + "[" * 100 + "]" * 100 + "}",
            has="nests deeper than 64")
        # --- SGLang /generate fields -----------------------------------------------------------
        err("POST", "/generate", {"input_ids": "abc"}, has="input_ids")
        err("POST", "/generate", {"input_ids": [1, "x"]}, has="input_ids[1]")
        err("POST", "/generate", {"input_ids": [1, 100000]}, has="input_ids[1]: token id 100000 outside [0, 512)")
        err("POST", "/generate", {"input_ids": [[1], [2, -1]]}, has="input_ids[1][1]")
        err("POST", "/generate", {"input_ids": []}, has="input_ids")
        err("POST", "/generate", {"text": "a", "input_ids": [1]}, has="exactly one of")
        err("POST", "/generate", {"text": 5}, has="text")
        err("POST", "/generate", {"text": "Hello there"}, has="outside the model's vocabulary")
        err("POST", "/generate", {"input_ids": [1], "foo": 1}, has="unknown field 'foo'")
        err("POST", "/generate", {"input_ids": [1], "sampling_params": {"temp": 1}},
            has="unknown field 'sampling_params.temp'")
        err("POST", "/generate", {"input_ids": [1], "sampling_params": {"temperature": "hot"}},
            has="sampling_params.temperature: expected a number, got a string")
        err("POST", "/generate", {"input_ids": [1], "sampling_params": {"temperature": -1}},
            has="sampling_params.temperature: -1 outside")
        err("POST", "/generate", {"input_ids": [1], "sampling_params": {"max_new_tokens": -1}},
            has="sampling_params.max_new_tokens")
        err("POST", "/generate", {"input_ids": [1], "sampling_params": {"max_new_tokens": 1e12}},
            has="sampling_params.max_new_tokens")
        err("POST", "/generate", {"input_ids": [1], "sampling_params": {"max_new_tokens": 600}},
            has="range")
        err("POST", "/generate", {"input_ids": [1], "sampling_params": {"top_p": 0}}, has="top_p")
        err("POST", "/generate", {"input_ids": [1], "sampling_params": {"n": 0}}, has="sampling_params.n")
        err("POST", "/generate", {"input_ids": [1], "sampling_params": {"stop_token_ids": [1] * 17}},
            has="stop_token_ids")
        err("POST", "/generate", {"input_ids": [1], "sampling_params": {"stop": [""]}},
            has="empty stop string")
        err("POST", "/generate", {"input_ids": [1], "sampling_params": {"regex": "a+"}},
            want=501, has="regex")
        err("POST", "/generate", {"input_ids": [1], "sampling_params": {"min_p": 0.1}},
            has="sampling_params.min_p")
        err("POST", "/generate", {"input_ids": [1], "return_logprob": "yes"},
            has="return_logprob: expected a boolean")
        err("POST", "/generate", {"input_ids": [1], "top_logprobs_num": 50}, has="top_logprobs_num")
        err("POST", "/generate", {"input_ids": [1], "lora_path": "x"}, want=501, has="lora_path")
        err("POST", "/generate", {"input_ids": [1], "sampling_params": []}, has="sampling_params")
        # --- control routes ---------------------------------------------------------------------
        err("POST", "/pause_generation", {"mode": 3}, has="mode")
        err("POST", "/pause_generation", {"how": "x"}, has="unknown field 'how'")
        err("POST", "/update_weights_from_disk", {}, has="model_path: missing")
        err("POST", "/update_weights_from_disk", {"model_path": 7}, has="model_path")
        err("POST", "/update_weights_from_disk", {"model_path": "/x", "load_format": "pt"},
            want=501, has="load_format")
        err("POST", "/release_memory_occupation", {"tags": ["gpu"]}, has="unknown tag 'gpu'")
        err("POST", "/release_memory_occupation", {"tags": "weights", "x": 1}, has="unknown field")
        # --- OpenAI -----------------------------------------------------------------------------
        err("POST", "/v1/completions", {"model": "m"}, has="prompt: missing")
        err("POST", "/v1/completions", {"prompt": {"a": 1}}, has="prompt")
        err("POST", "/v1/completions", {"prompt": [1], "max_tokens": "ten"},
            has="max_tokens: expected an integer")
        err("POST", "/v1/completions", {"prompt": [1], "logprobs": 99}, has="logprobs")
        err("POST", "/v1/completions", {"prompt": [1], "n": 0}, has="n: 0 outside")
        err("POST", "/v1/completions", {"prompt": [1], "echo": True}, want=501, has="echo")
        err("POST", "/v1/completions", {"prompt": [1], "presence_penalty": 0.5}, has="presence_penalty")
        err("POST", "/v1/completions", {"prompt": [1], "stop": [1, 2]}, has="stop[0]")
        err("POST", "/v1/completions", {"prompt": [1], "bogus": True}, has="unknown field 'bogus'")
        err("POST", "/v1/chat/completions", {"messages": "hi"}, has="messages")
        err("POST", "/v1/chat/completions", {"messages": [{"role": "robot", "content": "x"}]},
            has="messages[0].role: 'robot'")
        err("POST", "/v1/chat/completions", {"messages": [{"content": "x"}]}, has="messages[0].role: missing")
        err("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]},
            has="messages[0].content")
        err("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            want=501, has="text")
        err("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                             "tools": [{"type": "function"}]}, want=501, has="tools")
        err("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                             "top_logprobs": 3}, has="top_logprobs needs logprobs")
        err("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]},
            has="outside the model's vocabulary")  # the tiny model has 512 ids
        # --- sizes --------------------------------------------------------------------------------
        big = b"POST /generate HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n" \
              b"Content-Length: %d\r\n\r\n{" % (TOKEN.encode(), 64 << 20)
        resp = raw(w, big)
        ok(status_of(resp) == 413 and b"at most" in resp, "Content-Length 64 MiB -> 413 at once")
        s = socket.create_connection((w.host, w.port), timeout=20)
        s.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
                  b"Transfer-Encoding: chunked\r\n\r\n" % TOKEN.encode())
        chunk = b"%x\r\n%s\r\n" % (1 << 20, b" " * (1 << 20))
        got = b""
        try:
            for _ in range(40):
                s.sendall(chunk)
            s.sendall(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass
        try:
            while True:
                b = s.recv(65536)
                if not b:
                    break
                got += b
        except (socket.timeout, ConnectionResetError):
            pass
        s.close()
        ok(status_of(got) == 413, "chunked body over 32 MiB -> 413 (%r)" % got[:40])
        # --- slow clients ----------------------------------------------------------------------
        stalls = []
        for data in (b"POST /generate HTTP/1.1\r\nHost: x\r\n",  # headers never end
                     b"POST /generate HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
                     b"Content-Length: 100\r\n\r\n{\"inp" % TOKEN.encode()):  # body never ends
            c = socket.create_connection((w.host, w.port), timeout=15)
            c.sendall(data)
            stalls.append(c)
        t0 = time.time()
        st, _, r = w.request("POST", "/generate", {"input_ids": ref["prompts"][0],
                                                    "sampling_params": {"temperature": 0, "max_new_tokens": 24}})
        ok(st == 200 and r["output_ids"] == ref["greedy"][0] and time.time() - t0 < 2,
           "other clients are served while two stall")
        for i, c in enumerate(stalls):
            try:
                b = c.recv(100)
                closed = True
            except socket.timeout:
                closed, b = False, b""
            ok(closed and time.time() - t0 < 12, "stalled client %d closed after the idle timeout "
               "(%.1f s, %r)" % (i, time.time() - t0, b[:30]))
            c.close()
        # more idle connections than the limit (64): the surplus is refused, the worker serves on
        idle = []
        for _ in range(70):
            try:
                idle.append(socket.create_connection((w.host, w.port), timeout=5))
            except OSError:
                break
        for c in idle:
            c.close()
        time.sleep(0.5)
        st, _, _ = w.request("GET", "/health")
        ok(st == 200, "served after %d idle connections" % len(idle))
        # --- clients that leave mid-generation -------------------------------------------------
        for stream in (False, True):
            body = ('{"input_ids": %s, "sampling_params": {"temperature": 0, "max_new_tokens": 480},'
                    ' "stream": %s}' % (ref["prompts"][0], "true" if stream else "false")).encode()
            c = socket.create_connection((w.host, w.port), timeout=10)
            c.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
                      b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                      % (TOKEN.encode(), len(body), body))
            time.sleep(0.3)
            c.close()
            idle_now = False
            for _ in range(100):
                s = w.ctl("stats")
                if s["queue"]["requests_in_flight"] == 0:
                    idle_now = True
                    break
                time.sleep(0.1)
            ok(idle_now, "a client that left (%s) had its request aborted"
               % ("stream" if stream else "no stream"))
        # --- still exact --------------------------------------------------------------------------
        ok(w.ctl("checksum") == sums0, "every checksum unchanged")
        for i in range(4):
            st, _, r = w.request("POST", "/generate", {
                "input_ids": ref["prompts"][i], "sampling_params": {"temperature": 0, "max_new_tokens": 24}})
            ok(st == 200 and r["output_ids"] == ref["greedy"][i], "HTTP greedy %d = reference" % i)
        z = w.ctl("generate", *sum([["--prompt", ",".join(map(str, p))] for p in ref["prompts"]], []),
                  "--max-new-tokens", "24")
        ok([o["tokens"] for o in z["outputs"]] == ref["greedy"], "ZeroMQ greedy = reference")
        st, _, h = w.request("GET", "/health")
        ok(st == 200 and h["state"] == "serving", "health: serving")
    finally:
        code = w.stop()
    ok(code == 0, "worker exit 0")
    if ok.failed:
        print(w.log()[-3000:])
    return ok.done()


if __name__ == "__main__":
    sys.exit(main())
