#!/usr/bin/env bash
# pack-variants.sh - rw-bench built once for each of several variants of the working tree, as one
# archive for a GPU machine that should compare them in one call (run-variants.sh):
#
#   tools/gpu/pack-variants.sh BUILD_DIR NAME=SPEC [NAME=SPEC ...]
#   (GPU machine, carry .deps and .gpu-pack) tools/gpu/run-variants.sh NAME ... -- RW-BENCH ARGS
#
# SPEC is a patch file (applied to the working tree with git apply, the build brought up to date,
# rw-bench copied, the patch taken back out), "-" for the working tree as it is, or DEFINE=VALUE
# for the working tree compiled with a preprocessor value: the header or source line
# "#define DEFINE ..." is rewritten to VALUE for the build and restored after it (the file that
# holds it is found with git grep; it must hold it once). Several values join with commas,
# A=1,B=0 (so a VALUE holds no comma). BUILD_DIR is a build configured for the
# GPU (meson setup BUILD_DIR -Dcuda=enabled -Dgpu_arch=90a); a variant that only touches a few
# files rebuilds only what depends on them (meson does not see header changes in .cu files:
# SPEC files that change a .cuh touch the .cu files that include it). The archive is
# .gpu-pack/variants.txz: NAME's rw-bench at ./rw-NAME, and variants.txt with each name and spec;
# xz-compressed with a dictionary larger than a program, so the variants, nearly the same bytes,
# are stored about once (seven variants: 1.9 MB, against 29 MB gzip-compressed, which with the
# checkout went past what a device call carries).
# The working tree ends as it began; a failed step stops the script with the tree restored.
set -euo pipefail
cd "$(dirname "$0")/../.."
[ $# -ge 2 ] || { sed -n '2,16p' "$0" >&2; exit 2; }
BUILD=$1
shift
[ -f "$BUILD/build.ninja" ] || { echo "pack-variants: $BUILD is not a configured build directory" >&2; exit 2; }
stage=$(mktemp -d)
undo=""
changed=()
restore() { # the tree back as it was, and the .cu files that see a restored header rebuilt
    if [ -n "$undo" ]; then
        eval "$undo"
        touch_users "${changed[@]}"
    fi
    undo=""
    changed=()
}
trap 'restore; rm -rf "$stage"' EXIT
# meson does not rebuild a .cu file when only a header it includes changed: touch the .cu files
# that include one of these headers, directly or through other headers
touch_users() {
    local f base
    local -A seen=()
    local -a todo=("$@")
    while [ ${#todo[@]} -gt 0 ]; do
        f=${todo[0]}
        todo=("${todo[@]:1}")
        case "$f" in *.cuh | *.h) ;; *) continue ;; esac
        base=$(basename "$f")
        [ -n "${seen[$base]:-}" ] && continue
        seen[$base]=1
        # a header no .cu file includes is no failure (git grep exits 1 when it finds nothing)
        { git grep -l "#include \"$base\"" -- '*.cu' || true; } | xargs -r touch
        mapfile -t -O ${#todo[@]} todo < <(git grep -l "#include \"$base\"" -- '*.cuh' '*.h' || true)
    done
}
for v in "$@"; do
    name=${v%%=*}
    spec=${v#*=}
    case "$name" in '' | *[!A-Za-z0-9_-]*) echo "pack-variants: bad name '$name' (letters, digits, _ and -)" >&2; exit 2 ;; esac
    if [ "$spec" = - ]; then
        :
    elif [ -f "$spec" ]; then
        git apply "$spec" || { echo "pack-variants: $spec does not apply" >&2; exit 1; }
        undo="git apply -R '$spec'"
        mapfile -t changed < <(git apply --numstat "$spec" | cut -f3)
        touch_users "${changed[@]}"
    elif [[ "$spec" == *=* ]]; then
        IFS=, read -r -a defs <<< "$spec"
        for d in "${defs[@]}"; do
            def=${d%%=*}
            val=${d#*=}
            case "$d" in [A-Za-z_]*=*) ;; *) echo "pack-variants: '$d' (in '$spec') is no DEFINE=VALUE" >&2; exit 2 ;; esac
            mapfile -t hits < <(git grep -l -E "^#define $def( |$)" -- '*.h' '*.cuh' '*.cu' '*.c')
            [ ${#hits[@]} -eq 1 ] || { echo "pack-variants: '#define $def' is in ${#hits[@]} files (needs 1)" >&2; exit 2; }
            f=${hits[0]}
            # each file saved once, before its first rewrite; the undo restores the values made
            # so far, so a later bad DEFINE leaves the tree as it was
            if ! printf '%s\n' "${changed[@]}" | grep -qxF "$f"; then
                cp "$f" "$stage/orig.${#changed[@]}"
                undo="cp '$stage/orig.${#changed[@]}' '$f'; touch '$f'; $undo"
                changed+=("$f")
            fi
            sed -i -E "s|^#define $def( .*)?$|#define $def $val|" "$f"
        done
        touch_users "${changed[@]}"
    else
        echo "pack-variants: '$spec' is no patch file, '-' or DEFINE=VALUE" >&2
        exit 2
    fi
    echo "pack-variants: building $name ($spec)"
    ninja -C "$BUILD" tools/bench/rw-bench > "$stage/ninja.log" 2>&1 || { cat "$stage/ninja.log" >&2; exit 1; }
    cp "$BUILD/tools/bench/rw-bench" "$stage/rw-$name"
    strip "$stage/rw-$name"
    printf '%s\t%s\n' "$name" "$spec" >> "$stage/variants.txt"
    restore
done
# the build back to the tree as it is
ninja -C "$BUILD" tools/bench/rw-bench > /dev/null
mkdir -p .gpu-pack
(cd "$stage" && tar cf - rw-* variants.txt) | xz -9 -T0 > .gpu-pack/variants.txz
echo "pack-variants: .gpu-pack/variants.txz ($(du -h .gpu-pack/variants.txz | cut -f1)): $(cut -f1 "$stage/variants.txt" | tr '\n' ' ')"
