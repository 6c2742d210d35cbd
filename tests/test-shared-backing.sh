#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Several devices (and several targets of one device) over the same backing
# file: a write through one is seen through every other view of the same
# bytes; flush works on every device.
source "${top_srcdir:-$(dirname "$0")/..}/tests/functions.sh"

requires nbdkit --version
requires python3 -c 'import nbd'

f=$(mkfile shared.img 1M)
g=$(mkfile other.img 1M)
fill_random "$f" 1048576 3

# one: f sectors 0-99.
# two: f sectors 50-99, then a 2-stripe set over f 200-209 and g 0-9.
# alias: f sectors 0-9 twice (the same bytes at two device offsets), and
#        then f 205-209, which two also maps (stripe 0 chunk 1).
cat > "$tmpdir/one.table" <<EOF
0 100 linear $f 0
EOF
cat > "$tmpdir/two.table" <<EOF
0 50 linear $f 50
50 20 striped 2 5 $f 200 $g 0
EOF
cat > "$tmpdir/alias.table" <<EOF
0 10 linear $f 0
10 10 linear $f 0
20 5 linear $f 205
EOF

cat > "$tmpdir/shared.py" <<'EOF'
import sys
import nbd
S = 512
sock = sys.argv[1]
def conn(name):
    h = nbd.NBD()
    h.connect_uri("nbd+unix:///%s?socket=%s" % (name, sock))
    return h
one, two, alias = conn("one"), conn("two"), conn("alias")

# one sector 50+ == two sector 0+
one.pwrite(b"A" * 1000, 50 * S + 7)
one.flush()
assert two.pread(1000, 7) == b"A" * 1000
two.pwrite(b"B" * 3, 0, nbd.CMD_FLAG_FUA)
assert one.pread(3, 50 * S) == b"BBB"

# alias: sectors 0-9 and 10-19 are the same bytes, and both are one's 0-9.
alias.pwrite(b"C" * 700, 9 * S + 100)      # straddles the alias edge
alias.flush()
assert alias.pread(700, 19 * S + 100)[:412] == b"C" * 412   # wrapped part
assert one.pread(412, 9 * S + 100) == b"C" * 412
assert alias.pread(288, 0) == b"C" * 288    # spilled into sectors 10+ = f 0+
assert one.pread(288, 0) == b"C" * 288

# two's striped chunk 1 (device sectors 55-59) is g 0-4; chunk 2 (60-64)
# is f 205-209, which alias maps at 20-24.
two.pwrite(b"D" * 5 * S, 60 * S)
two.flush()
assert alias.pread(5 * S, 20 * S) == b"D" * 5 * S
alias.pwrite(b"E", 24 * S + S - 1)
assert two.pread(1, 65 * S - 1) == b"E"
for h in (one, two, alias):
    h.flush()
    h.shutdown()
print("shared.py: ok")
EOF

mapper -U - "$tmpdir/one.table" "$tmpdir/two.table" "$tmpdir/alias.table" \
       --run "python3 '$tmpdir/shared.py' \"\$unixsocket\"" ||
    die "shared backing file"

# And in the file itself.
python3 - "$f" <<'EOF'
import sys
S = 512
d = open(sys.argv[1], "rb").read()
assert d[50 * S:50 * S + 3] == b"BBB"
assert d[205 * S:210 * S - 1] == b"D" * (5 * S - 1)
assert d[210 * S - 1:210 * S] == b"E"
assert d[0:288] == b"C" * 288
EOF

echo "$0: ok"
