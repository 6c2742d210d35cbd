#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Stacking: "mapper:NAME" names another device of the same server.
#  - a mirror over two stacked devices (striped and linear over two
#    files): data lands where the lower tables say;
#  - a flush of the top device fdatasyncs each leaf file exactly once
#    (counted with strace);
#  - tables may come in any order (one stacking on a later file's device
#    waits for it);
#  - a device naming itself, or two stacking on each other, are refused
#    with a message naming the table line and the device.
source "${top_srcdir:-$(dirname "$0")/..}/tests/functions.sh"

requires nbdkit --version
requires python3 -c 'import nbd'
requires strace -V

f1=$(mkfile f1.img 4M)
f2=$(mkfile f2.img 4M)
cat > "$tmpdir/lowa.table" <<EOF
0 4096 striped 2 8 $f1 0 $f2 0
EOF
cat > "$tmpdir/lowb.table" <<EOF
0 4096 linear $f1 4096
EOF
cat > "$tmpdir/top.table" <<EOF
0 4096 mirror core 2 64 nosync 2 mapper:lowa 0 mapper:lowb 0
EOF

cat > "$tmpdir/io.py" <<'EOF'
import os, sys
import nbd
h = nbd.NBD()
h.set_export_name("top")
h.connect_unix(sys.argv[1])
data = bytes(range(256)) * 256              # 64K
h.pwrite(data, 8192)
h.flush()
assert h.pread(65536, 8192) == data
EOF

mapper --wrap "strace -f -qq -e trace=fdatasync -o $tmpdir/strace" \
       -f -U - "$tmpdir/lowa.table" "$tmpdir/lowb.table" "$tmpdir/top.table" \
       --run "python3 '$tmpdir/io.py' \"\$unixsocket\"" ||
    die "I/O through the stacked mirror failed"

# Two leaf files under three paths (lowa: f1+f2, lowb: f1): one
# fdatasync each.
n=$(grep -c 'fdatasync(' "$tmpdir/strace" || :)
[ "$n" = 2 ] || { cat "$tmpdir/strace"; die "expected 2 fdatasyncs, got $n"; }

# Where the data went: lowb = f1 from sector 4096; lowa = 4K chunks
# alternating f1, f2 from 0.
python3 - "$f1" "$f2" <<'EOF'
import sys
f1 = open(sys.argv[1], "rb").read()
f2 = open(sys.argv[2], "rb").read()
data = bytes(range(256)) * 256
S = 512
assert f1[4096 * S + 8192:4096 * S + 8192 + 65536] == data, "lowb"
for c in range(16):                     # chunks 2..17 of lowa
    chunk = 2 + c
    f = (f1, f2)[chunk % 2]
    off = (chunk // 2) * 4096
    assert f[off:off + 4096] == data[c * 4096:(c + 1) * 4096], "lowa %d" % c
print("stacked data in place")
EOF

# A device naming itself, and one naming a device loaded after it.
cat > "$tmpdir/self.table" <<EOF
0 8 linear mapper:self 0
EOF
if mapper -U - "$tmpdir/self.table" --run true 2> "$tmpdir/err"; then
    die "self-reference accepted"
fi
grep -q "self.table:1: linear: mapper:self: device 'self' has no live table.*cannot stack on itself" \
     "$tmpdir/err" || { cat "$tmpdir/err"; die "wrong message for self"; }

# Any file order: a table naming a device of a later file waits for it.
mapper -U - "$tmpdir/top.table" "$tmpdir/lowa.table" "$tmpdir/lowb.table" \
       --run 'nbdinfo --list "$uri"' > "$tmpdir/list" ||
    die "stacking on a device of a later file failed"
grep -q 'export="top"' "$tmpdir/list" || { cat "$tmpdir/list"; die "no top"; }

# Two tables stacking on each other: a cycle, refused.
echo "0 8 linear mapper:cyc2 0" > "$tmpdir/cyc1.table"
echo "0 8 linear mapper:cyc1 0" > "$tmpdir/cyc2.table"
if mapper -U - "$tmpdir/cyc1.table" "$tmpdir/cyc2.table" --run true \
          2> "$tmpdir/err"; then
    die "a stacking cycle was accepted"
fi
grep -q "cyc1.table:1: linear: mapper:cyc2: no such device 'cyc2' (not loaded: no table for it, or tables stacking on each other in a cycle)" \
     "$tmpdir/err" || { cat "$tmpdir/err"; die "wrong message for a cycle"; }

echo "$0: ok"
