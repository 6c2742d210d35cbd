#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Sizes, export list, descriptions and default export as seen by nbdinfo;
# --help and --dump-plugin output; tables=DIR.
source "${top_srcdir:-$(dirname "$0")/..}/tests/functions.sh"

requires nbdkit --version
requires nbdinfo --version
requires python3 -c 'import json'

a=$(mkfile a.img 1M)
b=$(mkfile b.img 1M)
c=$(mkfile c.img 1M)
d=$(mkfile d.img 1M)

# lin: 100 + 50 + 1 sectors over two files.
cat > "$tmpdir/lin.table" <<EOF
# a linear device
0 100 linear $a 7

100 50 linear $b 0    # second file
150 1 linear $a 300
EOF
# str: 3 stripes, chunk 3 sectors (not a power of two), 90 sectors.
cat > "$tmpdir/str.table" <<EOF
0 90 striped 3 3 $a 1000 $b 1000 $c 5
EOF
# pow2: 4 stripes, chunk 8, 256 sectors, then 64 sectors of zero.
cat > "$tmpdir/pow2.table" <<EOF
0 256 striped 4 8 $a 1200 $b 1200 $c 1200 $d 0
256 64 zero
EOF
# big: a large sparse-looking device made of zero + error.
cat > "$tmpdir/big.table" <<EOF
0 8388608 zero
8388608 2048 error
8390656 8386560 zero
EOF

expect_size ()
{
    local name=$1 want=$2 got
    got=$(mapper -U - "$tmpdir/$name.table" --run 'nbdinfo --size "$uri"')
    [ "$got" = "$want" ] || die "$name: size $got, expected $want"
}
expect_size lin $(( 151 * 512 ))
expect_size str $(( 90 * 512 ))
expect_size pow2 $(( 320 * 512 ))
expect_size big $(( 16777216 * 512 ))

# All four devices in one server: the list, descriptions, default export.
mapper -U - "$tmpdir/lin.table" "$tmpdir/str.table" \
       table="$tmpdir/pow2.table" "$tmpdir/big.table" \
       --run 'nbdinfo --list --json "$uri" > '"$tmpdir/list.json"' &&
              nbdinfo --json "$uri" > '"$tmpdir/default.json"' &&
              nbdinfo --list "$uri" > '"$tmpdir/list.txt"' &&
              nbdinfo --size "nbd+unix:///str?socket=$unixsocket" > '"$tmpdir/str.size"' &&
              nbdinfo --size "nbd+unix:///pow2?socket=$unixsocket" > '"$tmpdir/pow2.size"' &&
              nbdinfo --size "nbd+unix:///lin?socket=$unixsocket" > '"$tmpdir/lin.size"' &&
              nbdinfo --size "nbd+unix:///big?socket=$unixsocket" > '"$tmpdir/big.size"' &&
              { nbdinfo --size "nbd+unix:///nosuchdev?socket=$unixsocket" \
                   > '"$tmpdir/nosuch.out"' 2>&1 && echo UNEXPECTED ||
                echo refused; } > '"$tmpdir/nosuch.res"
cat "$tmpdir/list.txt"

[ "$(cat "$tmpdir/str.size")" = $(( 90 * 512 )) ] || die "str size via export name"
[ "$(cat "$tmpdir/pow2.size")" = $(( 320 * 512 )) ] || die "pow2 size via export name"
[ "$(cat "$tmpdir/lin.size")" = $(( 151 * 512 )) ] || die "lin size via export name"
[ "$(cat "$tmpdir/big.size")" = $(( 16777216 * 512 )) ] || die "big size via export name"
[ "$(cat "$tmpdir/nosuch.res")" = refused ] ||
    die "connecting to a nonexistent export succeeded"

python3 - "$tmpdir/list.json" "$tmpdir/default.json" <<'EOF'
import json, sys
lst = json.load(open(sys.argv[1]))
dflt = json.load(open(sys.argv[2]))
names = [e["export-name"] for e in lst["exports"]]
want = {"lin": 151 * 512, "str": 90 * 512, "pow2": 320 * 512,
        "big": 16777216 * 512}
assert sorted(names) == sorted(want), "export list %r" % names
assert len(names) == len(set(names)), "duplicates in %r" % names
for e in lst["exports"]:
    n = e["export-name"]
    assert e.get("description"), "export %s has no description" % n
    assert e["export-size"] == want[n], "export %s size %r" % (n, e["export-size"])
    # The contract: writable, flush, trim, zero, FUA, multi-conn.
    for cap in ("can_flush", "can_trim", "can_zero", "can_fua",
                "can_multi_conn"):
        assert e.get(cap) is True, "export %s: %s is %r" % (n, cap, e.get(cap))
    assert e.get("is_read_only") is False, "export %s is read-only" % n
    assert "base:allocation" in e.get("contexts", []), \
        "export %s: no base:allocation" % n
# The default export is the first table (lin).
d = dflt["exports"][0]
assert d["export-size"] == 151 * 512, "default export size %r" % d["export-size"]
if "export-name" in d and d["export-name"] not in ("", "lin"):
    raise AssertionError("default export is %r" % d["export-name"])
print("list ok:", names)
EOF

# A device mentioned only via tables=DIR; default export = first by name.
mkdir "$tmpdir/dir"
cp "$tmpdir/str.table" "$tmpdir/dir/zz.table"
cp "$tmpdir/lin.table" "$tmpdir/dir/aa.table"
cp "$tmpdir/pow2.table" "$tmpdir/dir/mm.table"
echo "not a table" > "$tmpdir/dir/README"
mapper -U - tables="$tmpdir/dir" \
       --run 'nbdinfo --list --json "$uri" > '"$tmpdir/dir.json"' &&
              nbdinfo --size "$uri" > '"$tmpdir/dir.size"
python3 - "$tmpdir/dir.json" <<'EOF'
import json, sys
names = sorted(e["export-name"] for e in json.load(open(sys.argv[1]))["exports"])
assert names == ["aa", "mm", "zz"], "tables=DIR exports %r" % names
EOF
[ "$(cat "$tmpdir/dir.size")" = $(( 151 * 512 )) ] ||
    die "tables=DIR: default export is not the first by name (aa)"

# table= and tables= combined: devices load in parameter order, so the
# default export is whichever comes first.
cp "$tmpdir/pow2.table" "$tmpdir/first.table"
mapper -U - "$tmpdir/first.table" tables="$tmpdir/dir" \
       --run 'nbdinfo --size "$uri"' > "$tmpdir/o1.size"
[ "$(cat "$tmpdir/o1.size")" = $(( 320 * 512 )) ] ||
    die "table= then tables=: default export is not the table= one"
mapper -U - tables="$tmpdir/dir" table="$tmpdir/first.table" \
       --run 'nbdinfo --size "$uri" &&
              nbdinfo --size "nbd+unix:///first?socket=$unixsocket"' \
       > "$tmpdir/o2.size"
[ "$(cat "$tmpdir/o2.size")" = "$(( 151 * 512 ))
$(( 320 * 512 ))" ] ||
    die "tables= then table=: wrong default export or missing device"

# A table file without the .table suffix: the name is the whole basename.
cp "$tmpdir/str.table" "$tmpdir/plain-name"
mapper -U - "$tmpdir/plain-name" \
       --run 'nbdinfo --size "nbd+unix:///plain-name?socket=$unixsocket"' \
       > "$tmpdir/plain.size" || die "table without .table suffix"
[ "$(cat "$tmpdir/plain.size")" = $(( 90 * 512 )) ] || die "plain-name size"

# nbdkit -r: every device read-only, writes refused, backing untouched.
fill_random "$a" 1048576 8
cp "$a" "$tmpdir/a.orig"
mapper -r -U - "$tmpdir/lin.table" "$tmpdir/str.table" \
       --run 'nbdinfo --json "$uri" > '"$tmpdir/ro.json"' &&
              nbdinfo --json "nbd+unix:///str?socket=$unixsocket" > '"$tmpdir/ro2.json"' &&
              ! nbdsh -u "$uri" -c "h.pwrite(b\"x\" * 1000, 0)" 2>/dev/null &&
              ! nbdsh -u "$uri" -c "h.zero(1000, 0)" 2>/dev/null &&
              nbdsh -u "$uri" -c "assert len(h.pread(1000, 0)) == 1000"' ||
    die "read-only server"
grep -q '"is_read_only": true' "$tmpdir/ro.json" || die "-r: lin not read-only"
grep -q '"is_read_only": true' "$tmpdir/ro2.json" || die "-r: str not read-only"
cmp "$a" "$tmpdir/a.orig" || die "-r: backing file changed"

# --help documents the keys.
mapper --help > "$tmpdir/help" 2>&1 || die "--help failed"
grep -q 'table=' "$tmpdir/help" || die "--help does not mention table="
grep -q 'tables=' "$tmpdir/help" || die "--help does not mention tables="

# --dump-plugin prints the versions.
mapper --dump-plugin > "$tmpdir/dump" || die "--dump-plugin failed"
cat "$tmpdir/dump"
for k in mapper_version libnbd_version libev_version openssl_version; do
    grep -Eq "^$k=.+" "$tmpdir/dump" || die "--dump-plugin: no $k="
done
grep -q '^name=mapper$' "$tmpdir/dump" || die "--dump-plugin: name is not mapper"
grep -q '^has_list_exports=1$' "$tmpdir/dump" || die "no list_exports"

echo "$0: ok"
