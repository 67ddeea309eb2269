#!/usr/bin/env python3
"""Whether two cubins hold the same kernels: for every kernel, its machine code (.text.K), its
attributes (.nv.info.K: registers, barriers, parameter layout; the symbol index in them set
aside), its shared memory (.nv.shared.K, a size) and its constant bank (.nv.constant0.K) the
same bytes in both. Exit 0 when they are,
1 when not (naming the first sections that differ on stderr), 2 when a file is no 64-bit ELF.

    tools/gpu/cubin_kernels.py A.cubin B.cubin

ptx-same.sh's "same-sass" verdict. The ELF section table is read directly: this machine's
toolkit has ptxas but no disassembler, and the question is equality, not what the code says."""
import struct
import sys

KERNEL_SECTIONS = (".text.", ".nv.info.", ".nv.shared.", ".nv.constant0.")
SHT_NOBITS = 8
EIATTR_PARAM_CBANK = 0x0A  # value: the constant bank section's symbol index, offset, size


def info_entries(data):
    """A kernel's .nv.info attributes as (format, attribute, value) records, with the symbol index
    in its parameter bank record set to 0: that index moves whenever a symbol is added or removed
    anywhere in the file, while the kernel stays the same. None when the records do not parse (the
    caller then compares the raw bytes)."""
    out, i = [], 0
    while i < len(data):
        if i + 2 > len(data):
            return None
        fmt, attr = data[i], data[i + 1]
        if fmt == 0x04:  # a size and that many bytes
            if i + 4 > len(data):
                return None
            size = int.from_bytes(data[i + 2: i + 4], "little")
            if i + 4 + size > len(data):
                return None
            value = bytearray(data[i + 4: i + 4 + size])
            if attr == EIATTR_PARAM_CBANK and size >= 4:
                value[:4] = bytes(4)
            out.append((fmt, attr, bytes(value)))
            i += 4 + size
        elif fmt in (0x01, 0x02, 0x03):  # no value, or one of at most two bytes in a 4-byte record
            out.append((fmt, attr, data[i + 2: i + 4] if fmt != 0x01 else b""))
            i += 2 if fmt == 0x01 else 4
        else:
            return None
    return out


def kernel_sections(path):
    """{section name: (size, bytes)} for the sections that belong to one kernel."""
    b = open(path, "rb").read()
    if b[:4] != b"\x7fELF" or b[4] != 2:
        print("cubin_kernels: %s is not a 64-bit ELF file" % path, file=sys.stderr)
        sys.exit(2)
    shoff, = struct.unpack_from("<Q", b, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", b, 0x3A)
    hdrs = [struct.unpack_from("<IIQQQQIIQQ", b, shoff + i * shentsize) for i in range(shnum)]
    names = hdrs[shstrndx][4]
    out = {}
    for name_off, kind, _, _, off, size, *_ in hdrs:
        name = b[names + name_off: b.index(b"\0", names + name_off)].decode()
        if name.startswith(KERNEL_SECTIONS):
            # shared memory is NOBITS: a size, no bytes in the file
            data = b"" if kind == SHT_NOBITS else b[off: off + size]
            if name.startswith(".nv.info."):
                data = info_entries(data) or data
            out[name] = (size, data)
    return out


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    a, c = kernel_sections(sys.argv[1]), kernel_sections(sys.argv[2])
    if not a:
        print("cubin_kernels: no kernel sections in %s" % sys.argv[1], file=sys.stderr)
        return 1
    diff = sorted(n for n in set(a) | set(c) if a.get(n) != c.get(n))
    for n in diff[:5]:
        print("differs: %s" % n, file=sys.stderr)
    return 1 if diff else 0


if __name__ == "__main__":
    sys.exit(main())
