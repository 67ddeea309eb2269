"""rw_client - the Python client of rw rollout workers (docs/PROTOCOL.md): start and stop
workers (Worker), send every control command (Client: generate with token ids or text,
streaming, routed experts (Routes), score, pause, weight updates over ZeroMQ, checksums, stats,
...), and push a PyTorch
state_dict over NCCL (NcclGroup). Standard library only; PyTorch only for the NCCL push and for
torch tensors given to push_zmq / verify_checksums. The C library it drives (librw_client.so) and
rw-worker come from the rw build of the checkout it was installed from (python/README.md)."""

from .client import (COMMANDS, DEFAULT_CONTROL, Client, NcclGroup, Prompt, Routes, RWError,
                     Worker, expected_checksum, find_library, find_worker, load_safetensors)

__version__ = "0.1.0"
__all__ = ["RWError", "Worker", "Client", "NcclGroup", "Prompt", "Routes", "load_safetensors",
           "find_library", "find_worker", "expected_checksum", "COMMANDS", "DEFAULT_CONTROL"]
