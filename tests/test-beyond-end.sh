#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Requests beyond the end of a device fail and never touch the backing
# files; requests up to the last byte work and stay inside the table's
# areas, even when the backing files are larger than those areas.
source "${top_srcdir:-$(dirname "$0")/..}/tests/functions.sh"

requires nbdkit --version
requires python3 -c 'import nbd'

for f in f g h; do
    mkfile $f.img 64K >/dev/null
    fill_random "$tmpdir/$f.img" 65536 $RANDOM
    cp "$tmpdir/$f.img" "$tmpdir/$f.orig"
done

# lin: ends with a linear area in the middle of f.img (sectors 10-29).
cat > "$tmpdir/lin.table" <<EOF
0 20 linear $tmpdir/f.img 10
EOF
# str: ends with a striped target: 2 stripes of chunk 3, 6 sectors each,
# at g.img sectors 40-45 and h.img sectors 7-12, after one zero sector.
cat > "$tmpdir/str.table" <<EOF
0 1 zero
1 12 striped 2 3 $tmpdir/g.img 40 $tmpdir/h.img 7
EOF

mapper -U - "$tmpdir/lin.table" "$tmpdir/str.table" \
       --run "python3 '$top_srcdir/tests/beyond_end.py' \"\$unixsocket\"" \
       2> "$tmpdir/log" || { cat "$tmpdir/log"; die "beyond-end requests"; }
# The server itself saw (and refused) the out-of-range requests.
grep -q 'out of range' "$tmpdir/log" ||
    echo "$0: note: no 'out of range' message in the server log"

# Only the areas changed, and they hold exactly the data written.
python3 - "$tmpdir" <<'EOF'
import sys
d = sys.argv[1]
S = 512
def load(n):
    return open("%s/%s.img" % (d, n), "rb").read(), open("%s/%s.orig" % (d, n), "rb").read()
def dev(size):
    data = bytes((i * 7 + 3) & 0xff for i in range(size))
    return data[:-2] + b"\x5b\x5c"
def check(name, new, old, areas):
    assert len(new) == len(old) == 65536, name
    pos = 0
    for lo, hi, want in sorted(areas):
        assert new[pos:lo] == old[pos:lo], "%s changed before byte %d" % (name, lo)
        assert new[lo:hi] == want, "%s area %d-%d wrong" % (name, lo, hi)
        pos = hi
    assert new[pos:] == old[pos:], "%s changed after byte %d" % (name, pos)
lin = dev(20 * S)
f, fo = load("f")
check("f.img", f, fo, [(10 * S, 30 * S, lin)])
# str: device sector 0 is zero; then chunks of 3 sectors alternate g, h.
st = dev(13 * S)[S:]
C = 3 * S
g_area = st[0:C] + st[2 * C:3 * C]
h_area = st[C:2 * C] + st[3 * C:4 * C]
g, go = load("g")
hh, ho = load("h")
check("g.img", g, go, [(40 * S, 46 * S, g_area)])
check("h.img", hh, ho, [(7 * S, 13 * S, h_area)])
print("backing files ok")
EOF

echo "$0: ok"
