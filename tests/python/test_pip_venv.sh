#!/usr/bin/env bash
# test_pip_venv.sh - the Python package as a user installs it: a fresh virtual environment,
# `pip install ./python` without network access (--no-index; the package builds with the
# standard library only, python/rw_build.py), then its example run from another directory with
# the environment's python: the installed package (not the checkout's files) must load, find this
# checkout's build, push the fixture and reproduce the reference. Exits 77 without the venv module.
set -euo pipefail
root=${RW_SOURCE_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
python3 -c 'import venv, ensurepip' 2>/dev/null || { echo "skip: python3 has no venv/ensurepip"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m venv "$tmp/venv"
PIP_CONFIG_FILE=/dev/null "$tmp/venv/bin/pip" install --no-index --quiet "$root/python"
cp "$root/python/examples/quickstart.py" "$tmp/"
cd "$tmp"
out=$("$tmp/venv/bin/python" -c 'import rw_client, rw_client._checkout as c; print(rw_client.__file__); print(c.REPO)')
fails=0
case "$(head -1 <<<"$out")" in
    "$tmp/venv/"*) echo "ok   rw_client is imported from the environment" ;;
    *) echo "FAIL rw_client came from $(head -1 <<<"$out")"; fails=1 ;;
esac
[ "$(tail -1 <<<"$out")" = "$root" ] && echo "ok   it remembers the checkout $root" ||
    { echo "FAIL checkout: $(tail -1 <<<"$out")"; fails=1; }
"$tmp/venv/bin/python" -c 'from rw_client import Client; import typing' &&
    echo "ok   the client imports without torch" || fails=1
if "$tmp/venv/bin/python" quickstart.py; then echo "ok   the example runs"; else echo "FAIL the example"; fails=1; fi
echo "$((fails ? 0 : 4)) passed, $fails failed"
exit $fails
