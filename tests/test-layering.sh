#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The engine's layers, as the include lines show them (server/README.md):
#  - each public header compiles alone, first in an empty file;
#  - a leaf (a file under server/targets/ or server/backends/) includes
#    only its API (target.h, backend.h), the utilities (util.h) and
#    headers of its own directory, never a core-private header such as
#    internal.h; targets may also use the persistent-data layer's API,
#    pdata/thin-metadata.h;
#  - server/pdata/ (persistent-data, thin-pool metadata) is below the
#    engine: it includes its own headers and the C library, nothing else;
#  - the target types come from one list, server/targets.def, and the
#    backend kinds from another, server/backends/backends.def: each one
#    a file defines is listed there and built by server/Makefile.am, and
#    no core file names one.
source "${top_srcdir:-$(dirname "$0")/..}/tests/functions.sh"

cc=${CC:-cc}
requires "$cc" --version
srv=$top_srcdir/server

# Public headers: what layers above may include.
for h in util.h vector.h engine.h target.h backend.h pdata/thin-metadata.h pdata/clone-metadata.h; do
    printf '#include "%s"\nint main (void) { return 0; }\n' "$h" \
        > "$tmpdir/alone.c"
    "$cc" -fsyntax-only -Wall -Wextra -Wshadow -Wvla -Werror \
          -Wno-unused-parameter -I"$srv" "$tmpdir/alone.c" \
          > "$tmpdir/cc.out" 2>&1 ||
        { cat "$tmpdir/cc.out"; die "server/$h does not compile alone"; }
done

# leaf DIR HEADER...: files under server/DIR include only HEADERs and
# headers of DIR itself.
leaf ()
{
    local dir=$1 f inc bad=
    shift
    for f in "$srv/$dir"/*.[ch]; do
        while read -r inc; do
            case " $* " in *" $inc "*) continue ;; esac
            [ -f "$srv/$dir/$inc" ] && continue
            echo "server/$dir/${f##*/} includes \"$inc\""
            bad=1
        done < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$f")
    done
    [ -z "$bad" ] || die "server/$dir/ may include only ${*:+$* and }its own headers"
}
leaf targets target.h util.h pdata/thin-metadata.h pdata/clone-metadata.h
leaf backends backend.h util.h
leaf pdata

# server/pdata/: only the C library's (and POSIX threads') system headers.
libc=" assert.h endian.h errno.h inttypes.h limits.h pthread.h stdarg.h
  stdatomic.h stdbool.h stddef.h stdint.h stdio.h stdlib.h string.h "
for f in "$srv"/pdata/*.[ch]; do
    while read -r inc; do
        case "$libc" in *[[:space:]]"$inc"[[:space:]]*) continue ;; esac
        die "server/pdata/${f##*/} includes <$inc>: the layer uses only libc"
    done < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*<\([^>]*\)>.*/\1/p' "$f")
done

# one_list WHAT DEF MACRO DIR STRUCT SUFFIX: the names server/DEF lists
# as MACRO (NAME) are exactly those a file under server/DIR defines as
# "const struct STRUCT NAME_SUFFIX = {"; server/Makefile.am builds each
# such file and no core file names NAME_SUFFIX.  nr_listed: how many.
one_list ()
{
    local what=$1 def=$2 macro=$3 dir=$4 type=$5 suffix=$6
    local listed defined n file
    listed=$(sed -n "s/^$macro (\([a-z0-9_]*\))\$/\1/p" "$srv/$def")
    [ -n "$listed" ] || die "server/$def lists no $what"
    defined=$(sed -n "s/^const struct $type \([a-z0-9_]*\)_$suffix = {\$/\1/p" \
                  "$srv/$dir"/*.c)
    for n in $defined; do
        grep -qx "$n" <<< "$listed" ||
            die "$what ${n}_$suffix is not in server/$def"
    done
    for n in $listed; do
        grep -qx "$n" <<< "$defined" ||
            die "server/$def lists $n, which no file under server/$dir/ defines"
        file=$(grep -l "^const struct $type ${n}_$suffix = {" "$srv/$dir"/*.c)
        grep -q "$dir/${file##*/}" "$srv/Makefile.am" ||
            die "server/Makefile.am does not build ${file##*/}"
        if grep -lw "${n}_$suffix" "$srv"/*.c "$srv"/*.h > "$tmpdir/names"; then
            die "$(tr '\n' ' ' < "$tmpdir/names")names ${n}_$suffix: use server/$def"
        fi
    done
    nr_listed=$(wc -w <<< "$listed")
}
one_list "target type" targets.def TARGET targets target_type target
nr_targets=$nr_listed
one_list "backend kind" backends/backends.def BACKEND backends backend_kind \
    backend_kind
echo "layering: ok ($nr_targets targets, $nr_listed backend kinds)"
