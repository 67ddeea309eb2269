"""client.py - the Python client of rw workers (package rw_client): ctypes over librw_client.so
(the sync module's trainer-side C library), no packages beyond the standard library (torch only
when pushing torch tensors: NcclGroup, and push_zmq / verify_checksums given torch tensors).

What a PyTorch trainer does with it:

    from rw_client import Worker, Client, NcclGroup
    with Worker(config="config.json", random_weights=True, device="cuda", gpu=1) as w:
        c = Client(w.endpoint)
        group = NcclGroup([c], device=0)              # the trainer's GPU is rank 0
        group.push_state_dict(model.state_dict(), version="step-1")
        out = c.generate([[1, 2, 3]], max_new_tokens=16, temperature=1.0, seed=7)
        c.verify_checksums(model.state_dict(), config="config.json")

The wire protocol is docs/PROTOCOL.md; every command is reachable through Client.call().
"""

import ctypes
import glob
import json
import os
import select
import signal
import struct
import subprocess
import time
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

__all__ = ["RWError", "Worker", "Client", "NcclGroup", "load_safetensors", "find_library",
           "find_worker", "expected_checksum", "COMMANDS"]

_HERE = os.path.dirname(os.path.abspath(__file__))


def _checkout() -> str:
    """The rw checkout whose build this package uses: the one it was installed from (recorded by
    setup.py at install time), else the one it sits in (python/rw_client/ of a checkout)."""
    try:
        from . import _checkout as c  # written by setup.py
        return c.REPO
    except ImportError:
        return os.path.dirname(os.path.dirname(_HERE))


_REPO = _checkout()
DEFAULT_CONTROL = "tcp://127.0.0.1:5557"  # RW_DEFAULT_CONTROL (sync/rw_msg.h)
# A prompt: token ids, or text (a worker with a tokenizer encodes it).
Prompt = Union[Sequence[int], str]

# rw_dtype numbers (core/rw_core.h) and safetensors spellings
_DTYPES = {"bf16": 1, "f16": 2, "f32": 3, "i32": 4, "e4m3": 5, "ue8m0": 6, "u8": 7, "i64": 8,
           "f64": 9, "i8": 10, "bool": 11, "i16": 12}
_ST_DTYPES = {"BF16": "bf16", "F16": "f16", "F32": "f32", "I32": "i32", "F8_E4M3": "e4m3",
              "U8": "u8", "I64": "i64", "F64": "f64", "I8": "i8", "BOOL": "bool", "I16": "i16"}
_SIZES = {"bf16": 2, "f16": 2, "f32": 4, "i32": 4, "e4m3": 1, "ue8m0": 1, "u8": 1, "i64": 8,
          "f64": 8, "i8": 1, "bool": 1, "i16": 2}
_STATUS = ["ok", "invalid_arg", "out_of_memory", "io", "format", "unsupported", "not_found",
           "shape", "dtype", "cuda", "nccl", "zmq", "timeout", "state", "protocol", "busy",
           "weights_incomplete", "aborted", "internal", "auth", "no_device", "range"]
_ALIGN = 256  # RW_SYNC_ALIGN: every piece of a bucket starts at a multiple of this
# Every command of the protocol, in the order of the C command table (rw_cmd, sync/rw_msg.h);
# tests/sync/test_command_table.py checks that the two are equal.
COMMANDS = ("generate", "abort", "pause", "resume", "flush_cache", "init_weights_update_group",
            "begin_update", "update_weights", "update_weights_from_disk", "commit_update",
            "abort_update", "get_weight_version", "get_weights", "checksum", "release_memory",
            "resume_memory", "health", "stats", "shutdown", "score")


class RWError(Exception):
    """An error reply or a failed client call: `status` is the rw_status name."""

    def __init__(self, status, message):
        self.code = status if isinstance(status, int) else _STATUS.index(status)
        self.status = _STATUS[self.code] if 0 <= self.code < len(_STATUS) else str(status)
        self.message = message
        super().__init__("%s: %s" % (self.status, message))


class _Err(ctypes.Structure):
    _fields_ = [("status", ctypes.c_int), ("msg", ctypes.c_char * 512),
                ("where", ctypes.c_char * 64)]


def _newest(paths):
    paths = [p for p in paths if os.path.isfile(p)]
    return max(paths, key=os.path.getmtime) if paths else None


def find_library(path: Optional[str] = None) -> str:
    """librw_client.so: `path`, $RW_CLIENT_LIB, $RW_BUILD_ROOT/sync/client, or the newest
    build*/sync/client of the rw checkout (see _checkout)."""
    cands = [path, os.environ.get("RW_CLIENT_LIB")]
    if os.environ.get("RW_BUILD_ROOT"):
        cands.append(os.path.join(os.environ["RW_BUILD_ROOT"], "sync", "client", "librw_client.so"))
    for c in cands:
        if c and os.path.isfile(c):
            return c
    found = _newest(glob.glob(os.path.join(_REPO, "build*", "sync", "client", "librw_client.so")))
    if not found:
        raise FileNotFoundError("librw_client.so not found in %s/build*/sync/client: build rw "
                                "(tools/build.sh) or set RW_CLIENT_LIB (or RW_BUILD_ROOT)" % _REPO)
    return found


def find_worker(path: Optional[str] = None) -> str:
    """The rw-worker executable, found like the library."""
    cands = [path, os.environ.get("RW_WORKER_EXE")]
    if os.environ.get("RW_BUILD_ROOT"):
        cands.append(os.path.join(os.environ["RW_BUILD_ROOT"], "worker", "rw-worker"))
    for c in cands:
        if c and os.path.isfile(c):
            return c
    found = _newest(glob.glob(os.path.join(_REPO, "build*", "worker", "rw-worker")))
    if not found:
        raise FileNotFoundError("rw-worker not found in %s/build*/worker: build rw "
                                "(tools/build.sh) or set RW_WORKER_EXE (or RW_BUILD_ROOT)" % _REPO)
    return found


_LIBS = {}


def _lib(path=None):
    """Loads librw_client.so once per path and declares the functions used here."""
    p = find_library(path)
    if p in _LIBS:
        return _LIBS[p]
    L = ctypes.CDLL(p)
    vp, cp, sz, u64, i32 = (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint64,
                            ctypes.c_int)
    E = ctypes.POINTER(_Err)

    def d(name, res, *args):
        f = getattr(L, name)
        f.restype = res
        f.argtypes = list(args)

    d("rw_client_connect", i32, cp, vp, ctypes.POINTER(vp), E)
    d("rw_client_close", None, vp)
    d("rw_client_probe", i32, cp, i32, E)
    d("rw_client_send_json", i32, vp, cp, cp, ctypes.POINTER(vp), ctypes.POINTER(sz), sz,
      ctypes.POINTER(u64), E)
    d("rw_client_wait_json", i32, vp, u64, i32, ctypes.POINTER(vp), ctypes.POINTER(vp),
      ctypes.POINTER(sz), E)
    d("rw_client_free", None, vp)
    d("rw_client_session", cp, vp)
    d("rw_client_set_session", i32, vp, cp, E)
    d("rw_client_update_weights_zmq", i32, vp, vp, vp, i32, E)
    d("rw_client_group_create", i32, ctypes.POINTER(vp), ctypes.POINTER(i32), i32, cp, i32,
      ctypes.c_double, ctypes.POINTER(vp), E)
    d("rw_client_group_destroy", None, vp)
    d("rw_client_update_weights_nccl", i32, vp, vp, vp, vp, i32, E)
    d("rw_client_group_sync", i32, vp, vp, ctypes.c_double, E)
    d("rw_sync_manifest_create", i32, ctypes.POINTER(vp), E)
    d("rw_sync_manifest_destroy", None, vp)
    d("rw_sync_manifest_clear", None, vp)
    d("rw_sync_manifest_count", sz, vp)
    d("rw_sync_manifest_bytes", u64, vp)
    d("rw_sync_manifest_add", i32, vp, cp, i32, i32, ctypes.POINTER(ctypes.c_int64), i32,
      ctypes.c_int64, ctypes.c_int64, i32, ctypes.POINTER(u64), E)
    d("rw_checksum64", u64, vp, sz, u64)
    d("rw_config_load", i32, cp, vp, E)
    d("rw_config_free", None, vp)
    d("rw_sync_expected_checksum", i32, vp, i32, i32, cp, vp, i32, ctypes.POINTER(u64), E)
    _LIBS[p] = L
    return L


def _check(st, err):
    if st != 0:
        raise RWError(st, err.msg.decode(errors="replace"))


# ---------------------------------------------------------------------------------------------
# Tensors: torch tensors, or (dtype, shape, bytes) triples for code without torch
# ---------------------------------------------------------------------------------------------
def _torch_dtype_name(t):
    import torch
    m = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32",
         torch.int32: "i32", torch.uint8: "u8", torch.int64: "i64", torch.float64: "f64"}
    if hasattr(torch, "float8_e4m3fn"):
        m[torch.float8_e4m3fn] = "e4m3"
    if t.dtype not in m:
        raise ValueError("tensor dtype %s has no rw dtype" % t.dtype)
    return m[t.dtype]


def _describe(value):
    """(dtype name, shape list, nbytes, is_torch) of a torch tensor or a (dtype, shape, bytes)."""
    if isinstance(value, tuple):
        dt, shape, data = value
        return dt, list(shape), len(data), False
    return _torch_dtype_name(value), list(value.shape), value.numel() * value.element_size(), True


def _align(n):
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def _split_step(unit, limit):
    """Rows of `unit` bytes that one piece may hold within `limit` bytes: the most that fit,
    rounded down to a multiple of 128 when at least 128 fit (cuts on fp8 and mxfp8 block
    boundaries), 0 when one row does not fit. The rule of rw-trainer push
    (rw_sync_split_step in sync/sync_internal.h)."""
    if unit <= 0 or unit > limit:
        return 0
    n = limit // unit
    return n // 128 * 128 if n >= 128 else n


def _pieces(name, shape, nbytes, cap):
    """How a tensor of `nbytes` goes into buckets of `cap` bytes: [None] (whole) when it fits,
    else [(begin, length), ...] row ranges along dim 0 (manifest shard dim 0), each in a bucket
    of its own, cut at multiples of _split_step rows like rw-trainer push does (the 30B-A3B
    embedding and lm_head, 622 MB, exceed the default 512 MiB bucket)."""
    if nbytes <= cap:
        return [None]
    rows = shape[0] if shape else 0
    unit = nbytes // rows if rows else nbytes
    step = _split_step(unit, cap) if rows else 0
    if not step:
        raise ValueError("%s: one row (dim 0) is %d bytes, more than the bucket (%d bytes): "
                         "raise bucket_bytes" % (name, unit, cap))
    out, at = [], 0
    while at < rows:
        end = min((at // step + 1) * step, rows)
        out.append((at, end - at))
        at = end
    return out


def load_safetensors(path, device=None):
    """Reads a .safetensors file with the standard library: {name: (dtype, shape, bytes)}, or
    torch tensors on `device` when `device` is given (torch needed then)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, en = e["data_offsets"]
        dt = _ST_DTYPES[e["dtype"]]
        out[name] = (dt, e["shape"], data[b:en])
    if device is None:
        return out
    import torch
    tmap = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32,
            "i32": torch.int32, "u8": torch.uint8, "i64": torch.int64, "f64": torch.float64}
    res = {}
    for name, (dt, shape, raw) in out.items():
        u8 = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
        res[name] = u8.view(tmap[dt]).reshape(shape).to(device)
    return res


def expected_checksum(config, tp, rank, name, value, lib=None):
    """The checksum rank `rank` of a TP-`tp` worker serving `config` reports for canonical tensor
    `name` holding `value` (a torch tensor or a (dtype, shape, bytes) triple): the rank's slice,
    quantized when the worker quantizes that layer, xxh3-64."""
    L = _lib(lib)
    cfg = ctypes.create_string_buffer(16384)  # rw_config, opaque here
    err = _Err()
    _check(L.rw_config_load(config.encode(), cfg, ctypes.byref(err)), err)
    try:
        dt, _, nbytes, is_torch = _describe(value)
        if is_torch:
            host = value.detach().contiguous().cpu()
            ptr = ctypes.c_void_p(host.data_ptr())
        else:
            buf = ctypes.create_string_buffer(bytes(value[2]), nbytes)
            ptr = ctypes.cast(buf, ctypes.c_void_p)
        out = ctypes.c_uint64()
        _check(L.rw_sync_expected_checksum(cfg, tp, rank, name.encode(), ptr, _DTYPES[dt],
                                           ctypes.byref(out), ctypes.byref(err)), err)
        return out.value
    finally:
        L.rw_config_free(cfg)


# ---------------------------------------------------------------------------------------------
# Worker processes
# ---------------------------------------------------------------------------------------------
def _loaded_nccl_dir():
    """The folder of the libnccl already mapped into this process (a PyTorch trainer's own NCCL,
    loaded with torch), or None."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.rstrip("\n").split(" ")[-1]
                if "/libnccl.so" in path and os.path.exists(path):
                    return os.path.dirname(path)
    except OSError:
        pass
    return None


def _worker_env(env):
    """The environment of a worker started from this process. All members of an NCCL group must
    run the same NCCL version (a mismatch fails the join with "invalid usage"), and a trainer that
    imported torch uses torch's NCCL: the worker is pointed at the same library first, unless
    RW_WORKER_NCCL_DIR names another folder (empty: leave the loader's choice alone)."""
    env = dict(os.environ if env is None else env)
    d = os.environ.get("RW_WORKER_NCCL_DIR")
    if d is None:
        d = _loaded_nccl_dir()
    if d:
        old = env.get("LD_LIBRARY_PATH", "")
        env["LD_LIBRARY_PATH"] = d + (":" + old if old else "")
    return env


class Worker:
    """An rw-worker process (rank 0 of its ranks) started and stopped from Python.

    Worker(model=DIR) or Worker(config=FILE, random_weights=True); device "cpu" or "cuda";
    gpu: first CUDA ordinal; tp: ranks; control: address to bind (a free loopback port by
    default; the bound one is `endpoint`); kv_mb: KV cache size per rank in MiB (default: on
    CUDA 0.9 of the device memory free after the weights, less 768 MiB; give it when workers
    or other processes share the GPU); precision: "standard" (default) or "high" (CUDA: the KV
    cache, softmax weights and experts' down-projection input as hi + lo pairs too, routing as
    in fp32, twice the KV memory); tokenizer: a directory with tokenizer.json (text prompts and
    outputs); http: serve HTTP too ("0": a free loopback port, URL in `http_url`); extra_args:
    more rw-worker options."""

    def __init__(self, model: Optional[str] = None, config: Optional[str] = None,
                 random_weights: bool = False, seed: int = 0, tp: int = 1,
                 device: Optional[str] = None, gpu: Optional[int] = None,
                 control: str = "tcp://127.0.0.1:*", extra_args: Sequence[str] = (),
                 exe: Optional[str] = None, env: Optional[Dict[str, str]] = None,
                 start_timeout: float = 120, kv_mb: Optional[float] = None,
                 tokenizer: Optional[str] = None, http: Optional[str] = None,
                 precision: Optional[str] = None):
        args = [find_worker(exe)]
        if model:
            args += ["--model", model]
        if config:
            args += ["--config", config]
        if random_weights:
            args += ["--random-weights", "--seed", str(seed)]
        args += ["--tp", str(tp), "--control", control]
        if device:
            args += ["--device", device]
        if gpu is not None:
            args += ["--gpu", str(gpu)]
        if kv_mb is not None:
            args += ["--kv-mb", str(kv_mb)]
        if precision is not None:
            args += ["--precision", precision]
        if tokenizer:
            args += ["--tokenizer", tokenizer]
        if http is not None:
            args += ["--http", str(http)]
        args += list(extra_args)
        self.args = args
        self.env = env
        self.start_timeout = start_timeout
        self.proc = None
        self.endpoint = None  # the bound control address, once started
        self.http_url = None  # "http://HOST:PORT" when serving HTTP
        self.ready = None

    def start(self) -> "Worker":
        self.proc = subprocess.Popen(self.args, stdout=subprocess.PIPE, env=_worker_env(self.env))
        end = time.time() + self.start_timeout
        buf = b""
        while time.time() < end:
            r, _, _ = select.select([self.proc.stdout], [], [], 0.2)
            if r:
                ch = os.read(self.proc.stdout.fileno(), 4096)
                if not ch:
                    break
                buf += ch
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    try:
                        j = json.loads(line)
                    except ValueError:
                        continue
                    if isinstance(j, dict) and j.get("event") == "ready":
                        self.ready = j
                        self.endpoint = j["control"]
                        self.http_url = j.get("http")
                        return self
            elif self.proc.poll() is not None:
                break
        code = self.proc.poll()
        self.kill()
        raise RuntimeError("rw-worker did not become ready (exit status %s): %s" %
                           (code, " ".join(self.args)))

    def stop(self, timeout: float = 30) -> Optional[int]:
        """Shuts the worker down (in-flight requests get partial replies) and waits for it."""
        if not self.proc or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        try:
            c = Client(self.endpoint, timeout_ms=int(timeout * 1000))
            try:
                c.shutdown()
            finally:
                c.close()
        except (RWError, OSError):
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


# ---------------------------------------------------------------------------------------------
# Routed experts
# ---------------------------------------------------------------------------------------------
class Routes:
    """One output's routed experts (or routing weights) from a reply's data frame: `shape`
    [tokens, layers, top_k], `dtype` "u8" / "u16" (expert ids) or "f32" (weights), `data` the
    little-endian bytes. tolist() gives nested lists, numpy() an array (numpy needed)."""

    _FMT = {"u8": "B", "u16": "H", "f32": "f"}

    def __init__(self, desc, frame):
        self.shape = list(desc["shape"])
        self.dtype = desc["dtype"]
        off, n = desc["offset"], desc["nbytes"]
        if frame is None or off + n > len(frame):
            raise RWError("protocol", "routes outside the reply's data frame")
        self.data = bytes(frame[off:off + n])

    def tolist(self):
        t, l, k = self.shape
        v = struct.unpack("<%d%s" % (t * l * k, self._FMT[self.dtype]), self.data)
        return [[list(v[(i * l + j) * k:(i * l + j + 1) * k]) for j in range(l)]
                for i in range(t)]

    def numpy(self):
        import numpy as np
        dt = {"u8": np.uint8, "u16": "<u2", "f32": "<f4"}[self.dtype]
        return np.frombuffer(self.data, dtype=dt).reshape(self.shape)

    def __repr__(self):
        return "Routes(shape=%s, dtype=%s)" % (self.shape, self.dtype)


# ---------------------------------------------------------------------------------------------
# Control client
# ---------------------------------------------------------------------------------------------
class Client:
    """A connection to one worker's control address. Every command is `call(cmd, args)`; the
    helpers below name the common ones. Errors raise RWError."""

    def __init__(self, endpoint: str = DEFAULT_CONTROL, lib: Optional[str] = None,
                 timeout_ms: int = 60000, auth_token: Optional[str] = None,
                 probe_ms: int = 2000):
        self._c = ctypes.c_void_p()
        if not isinstance(endpoint, str):
            raise TypeError("endpoint: expected an address such as 'tcp://127.0.0.1:5557', got "
                            "%s" % type(endpoint).__name__)
        self.lib_path = find_library(lib)
        self.L = _lib(self.lib_path)
        self.endpoint = endpoint
        self.timeout_ms = timeout_ms
        self.auth_token = auth_token or os.environ.get("RW_AUTH_TOKEN")
        err = _Err()
        if probe_ms:  # ZeroMQ would wait in silence for a worker that is not there
            _check(self.L.rw_client_probe(endpoint.encode(), probe_ms, ctypes.byref(err)), err)
        _check(self.L.rw_client_connect(endpoint.encode(), None, ctypes.byref(self._c),
                                        ctypes.byref(err)), err)

    def close(self):
        if self._c:
            self.L.rw_client_close(self._c)
            self._c = ctypes.c_void_p()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    @property
    def handle(self):
        return self._c

    def send(self, cmd: str, args: Optional[Dict[str, Any]] = None,
             frames: Sequence[bytes] = ()) -> int:
        """Sends a command; returns its request id."""
        a = dict(args or {})
        if self.auth_token:
            a["auth"] = self.auth_token
        n = len(frames)
        bufs = [ctypes.create_string_buffer(bytes(f), len(f)) for f in frames]
        ptrs = (ctypes.c_void_p * max(n, 1))(*[ctypes.cast(b, ctypes.c_void_p) for b in bufs])
        lens = (ctypes.c_size_t * max(n, 1))(*[len(f) for f in frames])
        rid = ctypes.c_uint64()
        err = _Err()
        _check(self.L.rw_client_send_json(self._c, cmd.encode(), json.dumps(a).encode(), ptrs,
                                          lens, n, ctypes.byref(rid), ctypes.byref(err)), err)
        return rid.value

    def wait(self, rid: int, timeout_ms: Optional[int] = None, want_frame: bool = False) -> Any:
        """The result of request `rid` (and its data frame when want_frame)."""
        res = ctypes.c_void_p()
        frame = ctypes.c_void_p()
        flen = ctypes.c_size_t()
        err = _Err()
        st = self.L.rw_client_wait_json(self._c, rid, timeout_ms or self.timeout_ms,
                                        ctypes.byref(res), ctypes.byref(frame),
                                        ctypes.byref(flen), ctypes.byref(err))
        try:
            _check(st, err)
            text = ctypes.string_at(res.value).decode() if res.value else "null"
            data = ctypes.string_at(frame.value, flen.value) if frame.value else None
        finally:
            self.L.rw_client_free(res)
            self.L.rw_client_free(frame)
        result = json.loads(text)
        return (result, data) if want_frame else result

    def call(self, cmd: str, args: Optional[Dict[str, Any]] = None, frames: Sequence[bytes] = (),
             timeout_ms: Optional[int] = None) -> Any:
        return self.wait(self.send(cmd, args, frames), timeout_ms)

    # --- generation -----------------------------------------------------------------------
    @staticmethod
    def _gen_args(prompts: Union[Prompt, Sequence[Prompt]], **kw: Any) -> Dict[str, Any]:
        """The prompt fields of generate: one prompt (token ids or a string) or a list of them
        (all ids or all strings); refuses anything else with a message that says what it got."""
        def ids(p: Any, what: str) -> List[int]:
            out = []
            for i, t in enumerate(p):
                if isinstance(t, bool) or not isinstance(t, int):
                    raise TypeError("%s[%d]: token ids are ints, got %r" % (what, i, t))
                if t < 0:
                    raise ValueError("%s[%d]: token id %d is negative" % (what, i, t))
                out.append(t)
            if not out:
                raise ValueError("%s: an empty prompt" % what)
            return out

        if isinstance(prompts, str):
            a: Dict[str, Any] = {"text": prompts}
        elif isinstance(prompts, (list, tuple)) and prompts and all(
                isinstance(p, int) and not isinstance(p, bool) for p in prompts):
            a = {"prompt": ids(prompts, "prompt")}
        elif isinstance(prompts, (list, tuple)) and prompts and all(isinstance(p, str) for p in prompts):
            a = {"text": list(prompts)}
        elif isinstance(prompts, (list, tuple)) and prompts and all(
                isinstance(p, (list, tuple)) for p in prompts):
            a = {"prompts": [ids(p, "prompts[%d]" % i) for i, p in enumerate(prompts)]}
        else:
            raise TypeError("prompts: expected token ids ([1, 2, 3]), a list of them "
                            "([[1, 2], [3]]), a string or a list of strings; got %r"
                            % (prompts if not isinstance(prompts, (list, tuple))
                               else type(prompts).__name__ + " of " +
                               ", ".join(sorted({type(p).__name__ for p in prompts})) or "nothing"))
        for k, v in kw.items():
            if v is not None:
                a[k] = v
        return a

    def generate(self, prompts: Union[Prompt, Sequence[Prompt]], max_new_tokens: int = 16,
                 temperature: float = 0.0, top_p: Optional[float] = None,
                 top_k: Optional[int] = None, seed: Optional[int] = None,
                 stop: Optional[Sequence[int]] = None, top_logprobs: Optional[int] = None,
                 n: Optional[int] = None, logprobs: bool = True,
                 return_text: Optional[bool] = None,
                 timeout_ms: Optional[int] = None, logprob_mode: Optional[str] = None,
                 return_routed_experts: Optional[bool] = None,
                 return_routing_weights: Optional[bool] = None) -> List[Dict[str, Any]]:
        """Generates for one prompt or a list of prompts (token ids, or strings when the worker
        has a tokenizer); returns the outputs, one per request (prompt x n), in order:
        {tokens, logprobs, finish, weight_version, version_spans, ..., text (when asked or when
        the prompts were strings)}. logprob_mode "processed": logprobs under the distribution
        sampled from (temperature, top-k / top-p applied). return_routed_experts: each output's
        "routed_experts" is a Routes of [prompt + generated tokens, layers, top_k] expert ids
        (return_routing_weights: "routing_weights" a Routes of fp32 weights)."""
        a = self._gen_args(prompts, max_new_tokens=max_new_tokens, temperature=temperature,
                           top_p=top_p, top_k=top_k, seed=seed,
                           stop=list(stop) if stop is not None else None,
                           top_logprobs=top_logprobs, n=n, logprobs=logprobs,
                           return_text=return_text, logprob_mode=logprob_mode,
                           return_routed_experts=return_routed_experts,
                           return_routing_weights=return_routing_weights)
        return self._outputs("generate", a, timeout_ms)

    def score(self, prompts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]],
              prompt_logprobs: Optional[bool] = None, logprob_mode: Optional[str] = None,
              temperature: Optional[float] = None, top_p: Optional[float] = None,
              top_k: Optional[int] = None, top_logprobs: Optional[int] = None,
              return_routed_experts: Optional[bool] = None,
              return_routing_weights: Optional[bool] = None,
              timeout_ms: Optional[int] = None) -> List[Dict[str, Any]]:
        """Log-probabilities of given continuations (lists of token ids, one per prompt), one
        prefill each, no sampling: per pair {logprobs (one per continuation token),
        prompt_logprobs (with prompt_logprobs: entry 0 None), ...}; the same values generate
        reports for those tokens under the same logprob_mode / temperature / top_k / top_p."""
        a: Dict[str, Any] = {"prompts": [list(map(int, p)) for p in prompts],
                             "continuations": [list(map(int, c)) for c in continuations]}
        kw = dict(prompt_logprobs=prompt_logprobs, logprob_mode=logprob_mode,
                  temperature=temperature, top_p=top_p, top_k=top_k, top_logprobs=top_logprobs,
                  return_routed_experts=return_routed_experts,
                  return_routing_weights=return_routing_weights)
        a.update({k: v for k, v in kw.items() if v is not None})
        return self._outputs("score", a, timeout_ms)

    def _outputs(self, cmd: str, args: Dict[str, Any],
                 timeout_ms: Optional[int]) -> List[Dict[str, Any]]:
        """The outputs of a generate / score reply, routes taken out of its data frame."""
        result, frame = self.wait(self.send(cmd, args), timeout_ms, want_frame=True)
        outs = result["outputs"]
        for o in outs:
            for key in ("routed_experts", "routing_weights"):
                if key in o:
                    o[key] = Routes(o[key], frame)
        return outs

    def generate_stream(self, prompts: Union[Prompt, Sequence[Prompt]],
                        timeout_ms: Optional[int] = None,
                        **kw: Any) -> Iterator[Dict[str, Any]]:
        """Yields partial results ({"stream": true, outputs: [{index, offset, tokens, ...}]}) as
        tokens are made, then the final result ({"stream": false, outputs: [...]})."""
        kw.setdefault("max_new_tokens", 16)
        a = self._gen_args(prompts, stream=True, **kw)
        rid = self.send("generate", a)
        while True:
            r = self.wait(rid, timeout_ms)
            yield r
            if not r.get("stream"):
                return

    def abort(self, request_id=None, all=False):
        return self.call("abort", {"all": True} if all else {"request_id": request_id})

    def pause(self, mode="abort"):
        return self.call("pause", {"mode": mode})

    def resume(self):
        return self.call("resume")

    def flush_cache(self):
        return self.call("flush_cache")

    # --- weights ---------------------------------------------------------------------------
    def begin_update(self, version, flush_cache=False, bucket_bytes=None, timeout_s=None,
                     pause_mode=None):
        a = {"version": version, "flush_cache": flush_cache}
        if bucket_bytes:
            a["bucket_bytes"] = int(bucket_bytes)
        if timeout_s:
            a["timeout_s"] = float(timeout_s)
        if pause_mode:
            a["pause_mode"] = pause_mode
        return self.call("begin_update", a)

    @property
    def session(self):
        """The token of the update session this client opened (protocol 2): the C library sends
        it with update_weights, update_weights_from_disk, commit_update and abort_update."""
        return (self.L.rw_client_session(self._c) or b"").decode()

    @session.setter
    def session(self, token):
        err = _Err()
        _check(self.L.rw_client_set_session(self._c, (token or "").encode(), ctypes.byref(err)),
               err)

    def commit_update(self):
        return self.call("commit_update")

    def abort_update(self, force=False):
        """Ends this client's update session; force=True ends any client's (logged by the
        worker)."""
        return self.call("abort_update", {"force": True} if force else None)

    def update_weights_from_disk(self, path, version=None, only=None, flush_cache=False):
        a = {"path": path, "flush_cache": flush_cache}
        if version:
            a["version"] = version
        if only:
            a["only"] = only
        return self.call("update_weights_from_disk", a)

    def push_zmq(self, tensors, version, bucket_bytes=64 << 20, flush_cache=False):
        """Pushes {name: tensor} (torch tensors, moved to the host, or (dtype, shape, bytes)
        triples) as one update over ZeroMQ frames. The bucket is at most the update's size; a
        tensor larger than the bucket goes as row pieces (shard dim 0). Returns the commit
        result."""
        L = self.L
        err = _Err()
        described = [(name, value) + _describe(value) for name, value in tensors.items()]
        total = sum(_align(d[4]) for d in described)
        cap = int(max(1, min(bucket_bytes, total)))  # a small update needs no big bucket
        self.begin_update(version, flush_cache=flush_cache, bucket_bytes=cap)
        m = ctypes.c_void_p()
        _check(L.rw_sync_manifest_create(ctypes.byref(m), ctypes.byref(err)), err)
        try:
            pending = []  # (offset in the bucket, source bytes, first byte, byte count)

            def flush():
                if not pending:
                    return
                size = L.rw_sync_manifest_bytes(m)
                buf = ctypes.create_string_buffer(size)
                for off, raw, start, n in pending:
                    src = ctypes.cast(ctypes.c_char_p(raw), ctypes.c_void_p).value + start
                    ctypes.memmove(ctypes.addressof(buf) + off, src, n)
                _check(L.rw_client_update_weights_zmq(self._c, m, ctypes.cast(buf, ctypes.c_void_p),
                                                      self.timeout_ms, ctypes.byref(err)), err)
                L.rw_sync_manifest_clear(m)
                pending.clear()

            for name, value, dt, shape, nbytes, is_torch in described:
                raw = _torch_bytes(value) if is_torch else bytes(value[2])
                row = nbytes // shape[0] if shape and shape[0] else nbytes
                for piece in _pieces(name, shape, nbytes, cap):
                    start, n = (0, nbytes) if piece is None else (piece[0] * row, piece[1] * row)
                    if pending and _align(L.rw_sync_manifest_bytes(m)) + n > cap:
                        flush()
                    off = self._add(m, name, dt, shape, piece)
                    pending.append((off, raw, start, n))
            flush()
        except BaseException:
            try:
                self.abort_update()
            except RWError:
                pass
            raise
        finally:
            L.rw_sync_manifest_destroy(m)
        return self.commit_update()

    def _add(self, m, name, dt, shape, piece=None):
        """Appends `name` to manifest m, whole (piece None) or rows [begin, begin + length) of
        dim 0 (piece (begin, length)); returns its offset in the bucket."""
        err = _Err()
        sh = (ctypes.c_int64 * len(shape))(*shape)
        off = ctypes.c_uint64()
        dim, begin, length = (-1, 0, 0) if piece is None else (0, piece[0], piece[1])
        _check(self.L.rw_sync_manifest_add(m, name.encode(), _DTYPES[dt], len(shape), sh, dim,
                                           begin, length, 0, ctypes.byref(off),
                                           ctypes.byref(err)), err)
        return off.value

    def get_weight_version(self):
        return self.call("get_weight_version")

    def get_weights(self, name, rank=0):
        """(metadata, bytes) of rank `rank`'s canonical slice of `name`."""
        return self.wait(self.send("get_weights", {"name": name, "rank": rank}), want_frame=True)

    def checksum(self, names=None):
        """{rank: {name: int}} of the worker's canonical bytes."""
        r = self.call("checksum", {"names": list(names)} if names else {})
        return {e["rank"]: {k: int(v, 16) for k, v in e["checksums"].items()}
                for e in r["ranks"]}

    def verify_checksums(self, tensors, config, names=None):
        """Compares the worker's checksums with the ones computed here from {name: tensor};
        returns the number compared; raises RWError naming the first mismatch."""
        want_names = list(names or tensors.keys())
        got = self.checksum(want_names)
        tp = len(got)
        n = 0
        for rank, sums in got.items():
            for name in want_names:
                exp = expected_checksum(config, tp, rank, name, tensors[name], lib=self.lib_path)
                if sums[name] != exp:
                    raise RWError("internal", "checksum of %s on rank %d: worker %016x, "
                                  "trainer %016x" % (name, rank, sums[name], exp))
                n += 1
        return n

    # --- operations -----------------------------------------------------------------------
    def release_memory(self, weights=True, kv_cache=True):
        return self.call("release_memory", {"weights": weights, "kv_cache": kv_cache})

    def resume_memory(self, weights=True, kv_cache=True):
        return self.call("resume_memory", {"weights": weights, "kv_cache": kv_cache})

    def health(self):
        return self.call("health")

    def stats(self):
        return self.call("stats")

    def shutdown(self):
        return self.call("shutdown")


def _torch_bytes(t):
    """Host bytes of a tensor without numpy."""
    h = t.detach().contiguous().cpu()
    n = h.numel() * h.element_size()
    return ctypes.string_at(h.data_ptr(), n)


# ---------------------------------------------------------------------------------------------
# NCCL weight push from the trainer's GPU
# ---------------------------------------------------------------------------------------------
class NcclGroup:
    """The trainer's NCCL weight-update group: this process is rank 0 on CUDA device `device`;
    worker i (a Client) joins with worker_ranks[i] ranks (its TP degree, default 1)."""

    def __init__(self, clients, worker_ranks=None, device=0, name="weights", timeout_s=120.0):
        self.clients = list(clients)
        self.L = self.clients[0].L
        self.device = device
        self.name = name
        n = len(self.clients)
        ranks = list(worker_ranks or [1] * n)
        arr = (ctypes.c_void_p * n)(*[c.handle for c in self.clients])
        rk = (ctypes.c_int * n)(*ranks)
        self._g = ctypes.c_void_p()
        err = _Err()
        _check(self.L.rw_client_group_create(arr, rk, n, name.encode(), device, timeout_s,
                                             ctypes.byref(self._g), ctypes.byref(err)), err)

    def close(self):
        if self._g:
            self.L.rw_client_group_destroy(self._g)
            self._g = ctypes.c_void_p()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def push_state_dict(self, state_dict, version, bucket_bytes=512 << 20, flush_cache=False,
                        timeout_s=120.0, pause_mode=None):
        """Pushes {name: CUDA tensor on this group's device} as one update to every worker:
        tensors are packed into device buckets (two, alternating: one is filled while the other
        is broadcast) and broadcast with NCCL; no host copy. The bucket is at most the update's
        size; a tensor larger than the bucket goes as row pieces (shard dim 0), like rw-trainer
        push sends it. Returns a summary dict."""
        import torch
        L = self.L
        err = _Err()
        dev = torch.device("cuda", self.device)
        stream = torch.cuda.current_stream(dev)
        total = sum(t.numel() * t.element_size() for t in state_dict.values())
        aligned = sum(_align(t.numel() * t.element_size()) for t in state_dict.values())
        cap = int(max(1, min(bucket_bytes, aligned)))  # a small model needs no big bucket
        t0 = time.time()
        for c in self.clients:
            c.begin_update(version, flush_cache=flush_cache, bucket_bytes=cap,
                           timeout_s=timeout_s, pause_mode=pause_mode)
        bufs = [torch.empty(cap, dtype=torch.uint8, device=dev) for _ in range(2)]
        m = ctypes.c_void_p()
        _check(L.rw_sync_manifest_create(ctypes.byref(m), ctypes.byref(err)), err)
        nb = 0
        pieces = 0
        try:
            pending = []  # (offset in the bucket, tensor or row slice)

            def flush():
                nonlocal nb
                if not pending:
                    return
                buf = bufs[nb % 2]
                if nb >= 2:  # the broadcast that used this buffer must be done
                    _check(L.rw_client_group_sync(self._g, ctypes.c_void_p(stream.cuda_stream),
                                                  timeout_s, ctypes.byref(err)), err)
                for off, t in pending:
                    n = t.numel() * t.element_size()
                    buf[off:off + n].copy_(t.detach().contiguous().view(-1).view(torch.uint8))
                _check(L.rw_client_update_weights_nccl(
                    self._g, m, ctypes.c_void_p(buf.data_ptr()),
                    ctypes.c_void_p(stream.cuda_stream), int(timeout_s * 1000),
                    ctypes.byref(err)), err)
                nb += 1
                L.rw_sync_manifest_clear(m)
                pending.clear()

            for name, t in state_dict.items():
                if t.device != dev:
                    raise ValueError("%s is on %s, the group's device is %s" % (name, t.device,
                                                                                dev))
                dt = _torch_dtype_name(t)
                size = t.numel() * t.element_size()
                for piece in _pieces(name, list(t.shape), size, cap):
                    part = t if piece is None else t.detach()[piece[0]:piece[0] + piece[1]]
                    n = part.numel() * part.element_size()
                    if pending and _align(L.rw_sync_manifest_bytes(m)) + n > cap:
                        flush()
                    off = self.clients[0]._add(m, name, dt, list(t.shape), piece)
                    pending.append((off, part))
                    pieces += 1
            flush()
            _check(L.rw_client_group_sync(self._g, ctypes.c_void_p(stream.cuda_stream),
                                          timeout_s, ctypes.byref(err)), err)
        except BaseException:
            for c in self.clients:
                try:
                    c.abort_update()
                except RWError:
                    pass
            raise
        finally:
            L.rw_sync_manifest_destroy(m)
        commits = [c.commit_update() for c in self.clients]
        dt_s = time.time() - t0
        return {"version": version, "bytes": total, "tensors": len(state_dict), "pieces": pieces,
                "buckets": nb,
                "seconds": dt_s, "gbps": total / dt_s / 1e9 if dt_s > 0 else 0.0,
                "commits": commits}
