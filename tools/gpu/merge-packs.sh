#!/usr/bin/env bash
# merge-packs.sh - several test archives of pack-tests.sh (one a variant of the tree each) as one
# archive that a device call can carry beside the others:
#
#   tools/gpu/merge-packs.sh ARCHIVE NAME=PACK [NAME=PACK ...]
#   (GPU machine) tools/gpu/run-packed.sh ARCHIVE --variant NAME [--only REGEX ...]
#
# Each PACK (a tests.txz) is unpacked under NAME/ of the new archive. A call carries the checkout
# and its carried paths, 64 MiB in all, and one test archive is about 3.5 MB of it; the variants'
# programs differ in a few kernels, so the new archive lists each program's copies next to each
# other (sorted by path, then by the order of the NAMEs) and xz, in one block with a dictionary
# wider than a program's copies, stores a copy like the one before it in a few bytes: five
# variants took 4.6 MB where one takes 3.5 (9.8 MB in the blocks of xz -T0; two minutes here, and
# about 2 GiB of memory). NAME: letters, digits, _ and -.
set -euo pipefail
[ $# -ge 2 ] || { sed -n '2,13p' "$0" >&2; exit 2; }
ARCHIVE=$1
shift
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
names=()
for v in "$@"; do
    name=${v%%=*}
    pack=${v#*=}
    case "$name" in '' | *[!A-Za-z0-9_-]*) echo "merge-packs: bad name '$name' (letters, digits, _ and -)" >&2; exit 2 ;; esac
    [ "$name" != "$v" ] || { echo "merge-packs: '$v' is no NAME=PACK" >&2; exit 2; }
    [ ! -e "$stage/$name" ] || { echo "merge-packs: the name $name is given twice" >&2; exit 2; }
    [ -f "$pack" ] || { echo "merge-packs: no archive $pack (for $name)" >&2; exit 2; }
    mkdir "$stage/$name"
    tar xf "$pack" -C "$stage/$name" || { echo "merge-packs: cannot unpack $pack" >&2; exit 1; }
    [ -f "$stage/$name/manifest.tsv" ] || { echo "merge-packs: $pack has no manifest.tsv (not made by pack-tests.sh)" >&2; exit 1; }
    names+=("$name")
done
# every path any variant has, then each variant's copy of it in the order given
(cd "$stage" && for n in "${names[@]}"; do find "$n" ! -type d | cut -d/ -f2-; done) | sort -u > "$stage/.paths"
: > "$stage/.list"
while read -r p; do
    for n in "${names[@]}"; do
        [ -e "$stage/$n/$p" ] && printf '%s/%s\n' "$n" "$p" >> "$stage/.list"
    done
done < "$stage/.paths"
mkdir -p "$(dirname "$ARCHIVE")"
tar cf - -C "$stage" --no-recursion -T "$stage/.list" | xz -T1 --lzma2=preset=9,dict=192MiB > "$ARCHIVE.tmp"
mv "$ARCHIVE.tmp" "$ARCHIVE"
echo "merge-packs: $ARCHIVE (${names[*]}; $(du -h "$ARCHIVE" | cut -f1))"
