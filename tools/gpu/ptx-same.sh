#!/usr/bin/env bash
# ptx-same.sh - whether a change leaves the device code as it was: every CUDA source of a build
# compiled to PTX from the working tree and from a base revision, file by file, compared byte for
# byte. Runs on a machine without a GPU (nvcc only).
#
#   tools/gpu/ptx-same.sh [--base REV] [BUILD_DIR] [SOURCE ...]
#
# BUILD_DIR (default build-gpu) must be configured with the CUDA backend; its compile commands
# are reused, with the source root moved to a temporary checkout of REV (default HEAD) for the
# base side. SOURCE (paths as in the tree, e.g. worker/kernels/sample.cu) limits the comparison
# to those files; without any, every CUDA source is compiled twice (minutes). Prints "same",
# "reorder", "same-sass" or "differs" per file and exits 0 when none differs, 1 when one does, 2
# on a usage or build error. "reorder": the bytes differ, but every function's PTX is the same
# once comments and the numbers in block labels are set aside (a host-side change that
# instantiates templates in another order emits the same kernels in another order; ptxas
# compiles each on its own). "same-sass": the PTX differs (virtual registers numbered otherwise,
# say), but ptxas makes the same machine code of it: each kernel's code, attributes (registers,
# barriers, parameters), shared memory and constant bank sections of the two cubins are the
# same bytes (compared as ELF sections, tools/gpu/cubin_kernels.py; this machine's toolkit has
# no disassembler). Under "differs" it names the kernels whose machine code differs.
#
# What it is for: a refactor of kernel code (a helper named, code moved) whose PTX or machine
# code is the same is the same program, so it needs no GPU run to keep the results of the last
# one; anything else does.
set -euo pipefail
BASE=HEAD
while [ $# -gt 0 ]; do
    case "$1" in
    --base) shift; BASE=$1 ;;
    -*) echo "ptx-same: unknown option $1 (see the top of $0)" >&2; exit 2 ;;
    *) break ;;
    esac
    shift
done
cd "$(dirname "$0")/../.."
root=$(pwd)
BUILD=${1:-build-gpu}
[ $# -gt 0 ] && shift
[ -f "$BUILD/compile_commands.json" ] ||
    { echo "ptx-same: $BUILD is not a configured build directory" >&2; exit 2; }
[ -d /usr/local/cuda/bin ] && export PATH="$PATH:/usr/local/cuda/bin"
command -v nvcc > /dev/null || { echo "ptx-same: nvcc is not on PATH" >&2; exit 2; }
git rev-parse --verify -q "$BASE^{commit}" > /dev/null || { echo "ptx-same: no revision $BASE" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'git worktree remove --force "$tmp/base" > /dev/null 2>&1 || true; rm -rf "$tmp"' EXIT
git worktree add --detach -q "$tmp/base" "$BASE"
# one line a source: path in the tree, the directory its command runs in, the command for this
# tree and the same command for the base's checkout, tab-separated
python3 - "$root" "$(cd "$BUILD" && pwd)" "$tmp/base" "$@" > "$tmp/cmds" <<'PY'
import json, os, re, sys
root, build, base, only = sys.argv[1], sys.argv[2], sys.argv[3], set(sys.argv[4:])
for e in json.load(open(os.path.join(build, "compile_commands.json"))):
    src = os.path.normpath(os.path.join(e["directory"], e["file"]))
    if not src.endswith(".cu") or not src.startswith(root + os.sep):
        continue
    rel = os.path.relpath(src, root)
    if only and rel not in only:
        continue
    cmd = e["command"]
    # PTX for the first architecture the build targets, instead of an object
    cmd = re.sub(r"-gencode arch=compute_(\w+),code=sm_\w+", r"-arch=compute_\1", cmd, count=1)
    cmd = re.sub(r"-gencode arch=compute_\w+,code=sm_\w+", "", cmd)
    cmd = re.sub(r" -o \S+", " -o @OUT@", cmd).replace(" -c ", " -ptx ")
    # the tree's paths as the build writes them (relative to it), then the base's, absolute
    rel_root = os.path.relpath(root, e["directory"]) + "/"
    def moved(tok):
        pre = "-I" if tok.startswith("-I") else ""
        path = tok[len(pre):]
        for r in (rel_root, root + "/"):
            if path.startswith(r):
                return pre + os.path.join(base, path[len(r):])
        return tok
    base_cmd = " ".join(moved(t) for t in cmd.split(" "))
    print("%s\t%s\t%s\t%s" % (rel, e["directory"], cmd, base_cmd))
PY
[ -s "$tmp/cmds" ] || { echo "ptx-same: no CUDA source to compare" >&2; exit 2; }
# same_sass CMD OUT: both sides' PTX (OUT.base.ptx, OUT.new.ptx) assembled for the architecture
# CMD targets; whether every kernel's sections are the same bytes (OUT.why: those that are not)
same_sass() {
    local arch
    : > "$2.why"
    arch=$(grep -o -- '-arch=compute_[0-9a-z]*' <<< "$1" | head -1 | sed 's/-arch=compute_/sm_/')
    [ -n "$arch" ] || return 1
    ptxas -arch="$arch" "$2.base.ptx" -o "$2.base.cubin" 2> /dev/null || return 1
    ptxas -arch="$arch" "$2.new.ptx" -o "$2.new.cubin" 2> /dev/null || return 1
    python3 "$root/tools/gpu/cubin_kernels.py" "$2.base.cubin" "$2.new.cubin" 2> "$2.why"
}
status=0
while IFS=$'\t' read -r rel dir cmd base_cmd; do
    out=$tmp/$(echo "$rel" | tr / _)
    (cd "$dir" && eval "${cmd//@OUT@/$out.new.ptx}") > "$tmp/log" 2>&1 ||
        { cat "$tmp/log" >&2; echo "ptx-same: $rel does not compile in the working tree" >&2; exit 2; }
    if [ ! -f "$tmp/base/$rel" ]; then
        echo "new      $rel (not at $BASE)"
        status=1
        continue
    fi
    (cd "$dir" && eval "${base_cmd//@OUT@/$out.base.ptx}") > "$tmp/log" 2>&1 ||
        { cat "$tmp/log" >&2; echo "ptx-same: $rel does not compile at $BASE" >&2; exit 2; }
    if cmp -s "$out.new.ptx" "$out.base.ptx"; then
        echo "same     $rel"
    elif python3 - "$out.base.ptx" "$out.new.ptx" <<'PY'; then
import re, sys
def functions(path):  # name -> body, without comments, block label numbers normalized
    text = "\n".join(l for l in open(path).read().splitlines() if not l.lstrip().startswith("//"))
    parts = re.split(r"\n(?=(?:\.visible |\.weak )?(?:\.entry|\.func) )", text)
    out = {}
    for p in parts[1:]:
        m = re.match(r"(?:\.visible |\.weak )?(?:\.entry|\.func)\s+(?:\([^)]*\)\s*)?([^\s(]+)", p)
        out[m.group(1)] = re.sub(r"\$L__BB\d+_", "$L__BB_", p.strip())
    return parts[0].strip(), out
sys.exit(0 if functions(sys.argv[1]) == functions(sys.argv[2]) else 1)
PY
        echo "reorder  $rel (the same functions in another order)"
    elif same_sass "$cmd" "$out"; then
        echo "same-sass $rel (other PTX, the same machine code)"
    else
        echo "differs  $rel ($(diff "$out.base.ptx" "$out.new.ptx" | grep -c '^[<>]') lines)"
        sed 's/^/         /' "$out.why" # the kernels whose machine code differs, if it assembled
        status=1
    fi
done < "$tmp/cmds"
exit $status
