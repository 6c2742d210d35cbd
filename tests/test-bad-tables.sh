#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Bad tables make nbdkit refuse to start, with FILE:LINE: and the reason.
source "${top_srcdir:-$(dirname "$0")/..}/tests/functions.sh"

requires nbdkit --version

f=$(mkfile f.img 1M)

# refuse WHAT PATTERN... -- ARGS: nbdkit with ARGS must exit non-zero
# before running the --run command, printing every PATTERN (grep -E -i).
refuse ()
{
    local what=$1 pats=() rc=0
    shift
    while [ "$1" != -- ]; do pats+=("$1"); shift; done
    shift
    rm -f "$tmpdir/started" "$tmpdir/sock"
    # A Unix socket in the scratch dir rather than -U -: nbdkit 1.32 leaks
    # its /tmp/nbdkitXXXXXX directory when it fails during configuration.
    mapper -U "$tmpdir/sock" "$@" --run "touch '$tmpdir/started'" \
           > "$tmpdir/out" 2>&1 || rc=$?
    echo "--- $what (exit $rc):"
    cat "$tmpdir/out"
    [ "$rc" -ne 0 ] || die "$what: nbdkit exited 0"
    [ ! -e "$tmpdir/started" ] || die "$what: the server started"
    local p
    for p in "${pats[@]}"; do
        grep -Eiq -- "$p" "$tmpdir/out" ||
            die "$what: message does not match /$p/"
    done
}

# A gap between lines 2 and 4 (line 3 is a comment).
cat > "$tmpdir/gap.table" <<EOF
0 10 linear $f 0
# a comment
20 10 linear $f 10
EOF
refuse gap 'gap\.table:3:' 'gap|contiguous|expected|must start|hole|start' -- \
    "$tmpdir/gap.table"

# Overlap.
cat > "$tmpdir/overlap.table" <<EOF
0 10 linear $f 0
5 10 linear $f 10
EOF
refuse overlap 'overlap\.table:2:' -- "$tmpdir/overlap.table"

# First line not at sector 0.
printf '8 10 linear %s 0\n' "$f" > "$tmpdir/nozero.table"
refuse "not starting at 0" 'nozero\.table:1:' -- "$tmpdir/nozero.table"

# Unknown target on line 2.
cat > "$tmpdir/unknown.table" <<EOF
0 10 linear $f 0
10 10 frobnicate $f 0
EOF
refuse "unknown target" 'unknown\.table:2:' 'frobnicate' -- \
    "$tmpdir/unknown.table"

# A backend path that does not exist, named in the message.
cat > "$tmpdir/missing.table" <<EOF

0 10 linear $f 0
10 10 linear $tmpdir/no/such/file.img 0
EOF
refuse "missing backend" 'missing\.table:3:' "$tmpdir/no/such/file\\.img" -- \
    "$tmpdir/missing.table"

# A striped backend path that does not exist.
cat > "$tmpdir/missing2.table" <<EOF
0 12 striped 2 2 $f 0 $tmpdir/nothere.img 0
EOF
refuse "missing striped backend" 'missing2\.table:1:' "$tmpdir/nothere\\.img" -- \
    "$tmpdir/missing2.table"

# An area beyond the end of the backing file (1M = 2048 sectors).
printf '0 10 linear %s 2040\n' "$f" > "$tmpdir/beyond.table"
refuse "area beyond end of file" 'beyond\.table:1:' -- "$tmpdir/beyond.table"

# Striped: length not divisible by #stripes / chunk.
printf '0 10 striped 3 2 %s 0 %s 100 %s 200\n' "$f" "$f" "$f" > "$tmpdir/str1.table"
refuse "striped length vs stripes" 'str1\.table:1:' -- "$tmpdir/str1.table"
printf '0 12 striped 2 4 %s 0 %s 100\n' "$f" "$f" > "$tmpdir/str2.table"
refuse "striped length vs chunk" 'str2\.table:1:' -- "$tmpdir/str2.table"
printf '0 12 striped 2 0 %s 0 %s 100\n' "$f" "$f" > "$tmpdir/str3.table"
refuse "striped zero chunk" 'str3\.table:1:' -- "$tmpdir/str3.table"
printf '0 12 striped 3 2 %s 0 %s 100\n' "$f" "$f" > "$tmpdir/str4.table"
refuse "striped missing pair" 'str4\.table:1:' -- "$tmpdir/str4.table"

# Bad numbers.
printf '0 1x linear %s 0\n' "$f" > "$tmpdir/num.table"
refuse "bad number" 'num\.table:1:' -- "$tmpdir/num.table"
printf '0 -5 linear %s 0\n' "$f" > "$tmpdir/neg.table"
refuse "negative number" 'neg\.table:1:' -- "$tmpdir/neg.table"
printf '0 99999999999999999999999 zero\n' > "$tmpdir/ovf.table"
refuse "overflow" 'ovf\.table:1:' -- "$tmpdir/ovf.table"

# Wrong number of arguments.
printf '0 10 linear %s\n' "$f" > "$tmpdir/args.table"
refuse "linear missing offset" 'args\.table:1:' -- "$tmpdir/args.table"
printf '0 10 zero extra\n' > "$tmpdir/args2.table"
refuse "zero with an argument" 'args2\.table:1:' -- "$tmpdir/args2.table"

# A table with no targets at all.
printf '# nothing\n\n' > "$tmpdir/empty.table"
refuse "empty table" 'empty\.table' -- "$tmpdir/empty.table"

# The reserved name "control".
printf '0 10 zero\n' > "$tmpdir/control.table"
refuse "reserved name" 'control' 'reserved' -- "$tmpdir/control.table"
printf '0 10 zero\n' > "$tmpdir/fine.table"
refuse "reserved name, second table" 'control' 'reserved' -- \
    "$tmpdir/fine.table" "$tmpdir/control.table"
mkdir "$tmpdir/cdir"
cp "$tmpdir/control.table" "$tmpdir/fine.table" "$tmpdir/cdir/"
refuse "reserved name via tables=" 'control' 'reserved' -- \
    tables="$tmpdir/cdir"

# Duplicate device names, from two directories and via tables=DIR.
mkdir "$tmpdir/d1" "$tmpdir/d2"
printf '0 10 zero\n' > "$tmpdir/d1/dup.table"
printf '0 20 zero\n' > "$tmpdir/d2/dup.table"
refuse "duplicate names" 'dup' 'duplicate|already|twice' -- \
    "$tmpdir/d1/dup.table" "$tmpdir/d2/dup.table"
refuse "duplicate names via tables=" 'dup' 'duplicate|already|twice' -- \
    "$tmpdir/d1/dup.table" tables="$tmpdir/d2"

# No tables at all, an unknown key, a missing table file.
refuse "no tables" 'table' --
refuse "unknown key" 'frob' -- "$tmpdir/d1/dup.table" frob=1
refuse "missing table file" "$tmpdir/nonexistent\\.table" -- \
    "$tmpdir/nonexistent.table"
refuse "missing tables dir" "$tmpdir/nodir" -- tables="$tmpdir/nodir"

# Sanity: a good table with comments and blank lines starts fine.
cat > "$tmpdir/good.table" <<EOF
# comment

0 10 linear $f 0   # trailing comment
	10	6	zero
16 4 error
EOF
mapper -U - "$tmpdir/good.table" --run 'nbdinfo --size "$uri"' > "$tmpdir/good.size" ||
    die "good table refused"
[ "$(cat "$tmpdir/good.size")" = $(( 20 * 512 )) ] || die "good table size"

echo "$0: ok"
