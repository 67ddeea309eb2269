"""test_command_table.py - the Python client's list of commands (rw_client.COMMANDS) equals the C
command table (rw_cmd_name of librw_client.so, sync/cmd.c), name for name and in order.

Usage: python3 test_command_table.py   (RW_BUILD_ROOT or RW_CLIENT_LIB locate the library)"""

import ctypes
import os
import sys

sys.path.insert(0, os.path.join(os.environ.get("RW_SOURCE_ROOT",
                                               os.path.join(os.path.dirname(__file__), "..", "..")),
                                "python"))
import rw_client  # noqa: E402


def c_table(path):
    lib = ctypes.CDLL(path)
    lib.rw_cmd_name.restype = ctypes.c_char_p
    lib.rw_cmd_name.argtypes = [ctypes.c_int]
    lib.rw_cmd_parse.restype = ctypes.c_int
    lib.rw_cmd_parse.argtypes = [ctypes.c_char_p]
    names = []
    i = 1  # RW_CMD_NONE is 0
    while True:
        n = lib.rw_cmd_name(i)
        if n is None:
            break
        names.append(n.decode())
        assert lib.rw_cmd_parse(n) == i, "rw_cmd_parse(%s) != %d" % (n, i)
        i += 1
    assert lib.rw_cmd_name(0) is None, "RW_CMD_NONE has a name"
    assert lib.rw_cmd_parse(b"no_such_command") == 0
    return names


def main():
    c = c_table(rw_client.find_library())
    py = list(rw_client.COMMANDS)
    if c != py:
        print("the Python client's COMMANDS differ from the C command table:")
        print("  C:      %s" % c)
        print("  Python: %s" % py)
        return 1
    print("%d commands, the same in C and Python" % len(c))
    return 0


if __name__ == "__main__":
    sys.exit(main())
