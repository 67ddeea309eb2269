#!/usr/bin/env python3
"""test_cubin_kernels.py - cubin_kernels.py on synthetic ELF files (no toolkit needed): two files
with the same kernel sections and other symbol tables, or whose kernels' parameter bank records
name another symbol index, are the same; a changed byte of a kernel's code, another register
count, another shared memory size or a kernel only one file has differ (and are named); a file
that is no ELF is refused."""
import os
import struct
import subprocess
import sys
import tempfile

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "bench"))
from checklib import check, finish  # noqa: E402 (the bench tests' bookkeeping)

tool = os.path.join(here, "cubin_kernels.py")


def elf(sections):
    """A 64-bit little-endian ELF image with these sections [(name, type, bytes or size)]."""
    names = b"\0" + b"".join(n.encode() + b"\0" for n, _, _ in sections) + b".shstrtab\0"
    body, hdrs, at, name_at = b"", [], 64, 1
    for n, kind, data in sections:
        size = data if kind == 8 else len(data)
        hdrs.append((name_at, kind, at, size))
        if kind != 8:
            body += data
            at += len(data)
        name_at += len(n) + 1
    hdrs.append((name_at, 3, at, len(names)))  # .shstrtab
    body += names
    at += len(names)
    shoff = at
    head = bytearray(64)
    head[:5] = b"\x7fELF\x02"
    struct.pack_into("<Q", head, 0x28, shoff)
    struct.pack_into("<HHH", head, 0x3A, 64, len(hdrs) + 1, len(hdrs))
    table = bytes(64)  # section 0, null
    for name_off, kind, off, size in hdrs:
        table += struct.pack("<IIQQQQIIQQ", name_off, kind, 0, 0, off, size, 0, 0, 1, 0)
    return bytes(head) + body + table


def run(a, b):
    with tempfile.TemporaryDirectory() as d:
        pa, pb = os.path.join(d, "a.cubin"), os.path.join(d, "b.cubin")
        open(pa, "wb").write(a)
        open(pb, "wb").write(b)
        return subprocess.run([sys.executable, tool, pa, pb], capture_output=True, text=True)


def info(regs, sym):
    """k1's attributes: a register count (EIATTR_REGCOUNT-like, symbol and count) and the parameter
    bank record (symbol index, offset, size), both in the size-prefixed format"""
    return (b"\x04\x2f\x08\x00" + struct.pack("<II", 7, regs) +
            b"\x04\x0a\x08\x00" + struct.pack("<IHH", sym, 0x210, 0x48))


base = [(".text.k1", 1, b"\x01\x02\x03\x04"), (".nv.info.k1", 0x70000000, info(96, 0x84)),
        (".nv.shared.k1", 8, 4096), (".nv.constant0.k1", 1, b"\x00" * 8),
        (".text.k2", 1, b"\x05\x06"), (".symtab", 2, b"\x00" * 24)]
r = run(elf(base), elf(base[:-1] + [(".symtab", 2, b"\x01" * 48)]))
check(r.returncode == 0, f"the same kernels, other symbol table: exit {r.returncode} {r.stderr}")
# a symbol added elsewhere in the file moves the parameter bank's symbol index: still the same
r = run(elf(base), elf([base[0], (".nv.info.k1", 0x70000000, info(96, 0x85))] + base[2:]))
check(r.returncode == 0, f"another symbol index only: exit {r.returncode} {r.stderr}")


def changed(i, new):
    return base[:i] + [new] + base[i + 1:]


for i, new, what in [(0, (".text.k1", 1, b"\x01\x02\x03\x05"), "a byte of k1's code"),
                     (1, (".nv.info.k1", 0x70000000, info(128, 0x84)), "k1's register count"),
                     (2, (".nv.shared.k1", 8, 8192), "k1's shared memory size")]:
    r = run(elf(base), elf(changed(i, new)))
    check(r.returncode == 1 and new[0] in r.stderr, f"{what}: exit {r.returncode}, {r.stderr!r}")
r = run(elf(base), elf(base[:4] + base[5:]))
check(r.returncode == 1 and ".text.k2" in r.stderr, f"a kernel only A has: {r.returncode}")
r = run(b"not an elf file at all, padded to be long enough" * 2, elf(base))
check(r.returncode == 2 and "ELF" in r.stderr, f"no ELF: exit {r.returncode}, {r.stderr!r}")

finish("test_cubin_kernels")
