#!/usr/bin/env bash
# The engine's layers, as the include lines show them (server/README.md):
#  - each public header compiles alone, first in an empty file;
#  - a leaf (a file under server/targets/ or server/backends/) includes
#    only its API (target.h, backend.h), the utilities (util.h) and
#    headers of its own directory, never a core-private header such as
#    internal.h;
#  - the target types come from one list, server/targets.def, and the
#    backend kinds from another, server/backends/backends.def: each one
#    a file defines is listed there and built by server/Makefile.am, and
#    no core file names one.
source "${top_srcdir:-$(dirname "$0")/..}/tests/functions.sh"

cc=${CC:-cc}
requires "$cc" --version
srv=$top_srcdir/server

# Public headers: what layers above may include.
for h in util.h vector.h engine.h target.h backend.h; do
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
    [ -z "$bad" ] || die "server/$dir/ may include only $* and its own headers"
}
leaf targets target.h util.h
leaf backends backend.h util.h

# One list of target types.
listed=$(sed -n 's/^TARGET (\([a-z0-9_]*\))$/\1/p' "$srv/targets.def")
[ -n "$listed" ] || die "server/targets.def lists no target"
defined=$(sed -n 's/^const struct target_type \([a-z0-9_]*\)_target = {$/\1/p' \
              "$srv"/targets/*.c)
for t in $defined; do
    grep -qx "$t" <<< "$listed" ||
        die "target type ${t}_target is not in server/targets.def"
done
for t in $listed; do
    grep -qx "$t" <<< "$defined" ||
        die "server/targets.def lists $t, which no file under server/targets/ defines"
    file=$(grep -l "^const struct target_type ${t}_target = {" "$srv"/targets/*.c)
    grep -q "targets/${file##*/}" "$srv/Makefile.am" ||
        die "server/Makefile.am does not build ${file##*/}"
    if grep -lw "${t}_target" "$srv"/*.c "$srv"/*.h > "$tmpdir/names"; then
        die "$(tr '\n' ' ' < "$tmpdir/names")names ${t}_target: use server/targets.def"
    fi
done

# One list of backend kinds.
kinds=$(sed -n 's/^BACKEND (\([a-z0-9_]*\))$/\1/p' "$srv/backends/backends.def")
[ -n "$kinds" ] || die "server/backends/backends.def lists no backend kind"
defined=$(sed -n 's/^const struct backend_kind \([a-z0-9_]*\)_backend_kind = {$/\1/p' \
              "$srv"/backends/*.c)
for k in $defined; do
    grep -qx "$k" <<< "$kinds" ||
        die "backend kind ${k}_backend_kind is not in server/backends/backends.def"
done
for k in $kinds; do
    grep -qx "$k" <<< "$defined" ||
        die "server/backends/backends.def lists $k, which no file under server/backends/ defines"
    file=$(grep -l "^const struct backend_kind ${k}_backend_kind = {" "$srv"/backends/*.c)
    grep -q "backends/${file##*/}" "$srv/Makefile.am" ||
        die "server/Makefile.am does not build ${file##*/}"
    if grep -lw "${k}_backend_kind" "$srv"/*.c "$srv"/*.h > "$tmpdir/names"; then
        die "$(tr '\n' ' ' < "$tmpdir/names")names ${k}_backend_kind: use server/backends/backends.def"
    fi
done
echo "layering: ok ($(wc -w <<< "$listed") targets, $(wc -w <<< "$kinds") backend kinds)"
