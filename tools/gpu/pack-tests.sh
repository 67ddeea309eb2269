#!/usr/bin/env bash
# pack-tests.sh - the gpu suite's test programs and rw's executables from a build made here, as
# one archive for a GPU machine that should spend its time running them, not compiling them:
#
#   tools/gpu/pack-tests.sh [BUILD_DIR] [ARCHIVE]      default build-gpu, .gpu-pack/tests.txz
#   (GPU machine, carry .deps and .gpu-pack) tools/gpu/run-packed.sh .gpu-pack/tests.txz
#
# BUILD_DIR must be configured for the GPU (meson setup BUILD_DIR -Dcuda=enabled -Dgpu_arch=90a);
# it is brought up to date first. The archive holds, stripped and at their places under the build
# root, every program a gpu-suite test runs and every installed executable (rw-worker, rw-bench,
# ...: tests find them through RW_BUILD_ROOT), and manifest.tsv: one line a test with its name,
# timeout, whether meson expects it to fail, whether it may run beside other tests (meson's
# is_parallel), and its command, build-root paths written @B@/ and
# source paths @S@/ (run-packed.sh puts its own in). The libraries the programs link come from
# .deps (tools/gpu/stage-deps.sh), as for a build on that machine. The archive travels as a
# carried path (64 MiB in all, with the checkout): it is xz-compressed with a dictionary larger
# than a program, so the programs' shared static code is stored once (about 2.5 MiB, against
# 35 MiB gzip-compressed; about a minute here).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
BUILD=${1:-build-gpu}
ARCHIVE=${2:-.gpu-pack/tests.txz}
[ -f "$BUILD/build.ninja" ] || { echo "pack-tests: $BUILD is not a configured build directory" >&2; exit 2; }
# CUDA objects whose headers ninja does not know (Meson before 1.4 gives nvcc no depfile
# arguments, so an edited .cuh rebuilds nothing): those older than the newest header are removed
# so ninja compiles them again, and no archive carries a kernel built against an older header.
newest=$(find core moe quant sync worker \( -name '*.cuh' -o -name '*.h' \) -printf '%T@\n' |
    sort -n | tail -1)
ninja -C "$BUILD" -t deps | sed -n 's/^\(.*\.cu\.o\): #deps 0,.*/\1/p' | while read -r o; do
    if [ -f "$BUILD/$o" ] && [ "$(stat -c %Y "$BUILD/$o")" -lt "${newest%.*}" ]; then
        echo "pack-tests: $o predates a header it may include; rebuilding it" >&2
        rm -f "$BUILD/$o"
    fi
done
ninja -C "$BUILD" > /dev/null || { echo "pack-tests: the build of $BUILD failed" >&2; exit 1; }
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
meson introspect --tests "$BUILD" > "$stage/tests.json"
meson introspect --targets "$BUILD" > "$stage/targets.json"
python3 - "$root" "$(cd "$BUILD" && pwd)" "$stage" <<'PY'
import glob, json, os, re, shutil, subprocess, sys
src, build, stage = sys.argv[1], sys.argv[2], sys.argv[3]
tests = [t for t in json.load(open(f"{stage}/tests.json")) if "rw:gpu" in t["suite"]]
if not tests:
    sys.exit("pack-tests: the build has no gpu-suite tests (configured without CUDA?)")
# meson's introspection leaves out should_fail: read it from the test() calls of the meson.build files
expect_fail = set()
for mb in glob.glob(f"{src}/**/meson.build", recursive=True):
    for m in re.finditer(r"test\(\s*'([^']+)'(.*?)\)\s*$", open(mb).read(), re.S | re.M):
        if re.search(r"should_fail:\s*true", m.group(2)):
            expect_fail.add(m.group(1))
progs = set()
for t in json.load(open(f"{stage}/targets.json")):
    if t["type"] == "executable" and t.get("installed"):
        progs.update(t["filename"])
def place(arg):
    """A command argument with the build and source roots made relative."""
    a = os.path.normpath(arg) if arg.startswith("/") else arg
    if a.startswith(build + "/"):
        progs.add(a)
        return "@B@/" + os.path.relpath(a, build)
    if a.startswith(src + "/"):
        return "@S@/" + os.path.relpath(a, src)
    if a.startswith("/") and os.path.basename(a).startswith("python"):
        return "python3"  # the interpreter of this machine's path; the GPU machine has its own
    return arg
os.makedirs(f"{stage}/pack", exist_ok=True)
with open(f"{stage}/pack/manifest.tsv", "w") as man:
    for t in tests:
        cmd = [place(c) for c in t["cmd"]]
        man.write("\t".join([t["name"], str(t["timeout"]), "1" if t["name"] in expect_fail else "0",
                             "1" if t.get("is_parallel", True) else "0", json.dumps(cmd)]) + "\n")
for p in sorted(progs):
    dst = os.path.join(stage, "pack", os.path.relpath(p, build))
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    subprocess.run(["strip", "-o", dst, p], check=True)
print(f"pack-tests: {len(tests)} gpu-suite tests ({', '.join(sorted(expect_fail & {t['name'] for t in tests})) or 'none'} "
      f"expected to fail), {len(progs)} programs")
PY
mkdir -p "$(dirname "$ARCHIVE")"
tar cf - -C "$stage/pack" . | xz -9 -T0 > "$ARCHIVE"
echo "pack-tests: $ARCHIVE ($(du -h "$ARCHIVE" | cut -f1))"
