#!/usr/bin/env bash
# Stages the Debian packages rw builds against into .deps/ of this checkout, for a GPU machine that
# has the CUDA toolkit, NCCL, meson and ninja but no package registry. Run it here (on a machine
# with apt), carry .deps/ to the GPU machine, and there `source .deps/env.sh` before building:
#
#   tools/gpu/stage-deps.sh [more Debian packages ...]
#   (GPU machine) source .deps/env.sh && meson setup build-gpu -Dgpu_arch=90a && ninja -C build-gpu
#
# .deps/ is git-ignored; it holds the .deb files (a few MiB) and env.sh, which unpacks them once
# under /tmp/rw-deps and points pkg-config, the compiler and the loader there.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .deps
# the libraries and their -dev packages: ZeroMQ (with its own dependencies), msgpack-c, jansson,
# xxhash, cmocka, PCRE2 and utf8proc (tokenizer), libmicrohttpd (HTTP front)
pkgs=(libzmq5 libzmq3-dev libsodium23 libpgm-5.3-0 libnorm1
      libmsgpackc2 libmsgpack-dev libjansson4 libjansson-dev libxxhash0 libxxhash-dev
      libcmocka0 libcmocka-dev
      libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3 libpcre2-dev
      libutf8proc2 libutf8proc-dev libmicrohttpd12 libmicrohttpd-dev
      "$@")
if [ -z "$(find /var/lib/apt/lists -maxdepth 1 -name '*Packages*' -print -quit 2>/dev/null)" ]; then
    apt-get update -qq
fi
(cd .deps && apt-get download "${pkgs[@]}" 2>&1 | grep -v -e '^Get:' -e 'unsandboxed' || true)
cat > .deps/env.sh <<'ENV'
# Sourced on the GPU machine: unpacks the staged .deb files once and points pkg-config, the
# compiler and the loader at them.
_rw_deps=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
_rw_root=/tmp/rw-deps
if [ ! -f "$_rw_root/.done" ]; then
    mkdir -p "$_rw_root"
    for f in "$_rw_deps"/*.deb; do dpkg -x "$f" "$_rw_root"; done
    for pc in "$_rw_root"/usr/lib/x86_64-linux-gnu/pkgconfig/*.pc; do
        sed -i -e "s#^prefix=.*#prefix=$_rw_root/usr#" \
            -e "s#^libdir=\${\(exec_\)\{0,1\}prefix}/lib\$#libdir=\${prefix}/lib/x86_64-linux-gnu#" \
            -e '/^Requires.private/d' "$pc"
    done
    touch "$_rw_root/.done"
fi
export PKG_CONFIG_PATH="$_rw_root/usr/lib/x86_64-linux-gnu/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
export LD_LIBRARY_PATH="$_rw_root/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export LIBRARY_PATH="$_rw_root/usr/lib/x86_64-linux-gnu${LIBRARY_PATH:+:$LIBRARY_PATH}"
export CPATH="$_rw_root/usr/include${CPATH:+:$CPATH}"
ENV
echo "stage-deps: $(ls .deps/*.deb | wc -l) packages in .deps/ ($(du -sh .deps | cut -f1)); on the GPU machine: source .deps/env.sh"
