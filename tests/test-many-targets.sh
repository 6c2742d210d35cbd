#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# A table with 20000 one-sector targets interleaving three files (in
# reverse order in one of them): every request is split into many pieces.
# Copy the whole device in and out with nbdcopy and check the backing
# files against the table.
source "${top_srcdir:-$(dirname "$0")/..}/tests/functions.sh"

requires nbdkit --version
requires nbdcopy --version
requires cmp --version

N=20000
for f in x y z; do mkfile $f.img 4M >/dev/null; done
fill_random "$tmpdir/x.img" $(( 4 * 1048576 )) 21
fill_random "$tmpdir/y.img" $(( 4 * 1048576 )) 22
fill_random "$tmpdir/z.img" $(( 4 * 1048576 )) 23

# Sector i of the device: i%3==0 -> x sector i/3, i%3==1 -> y sector
# 8000 - i/3 (backwards), i%3==2 -> zero every 10th time, else z.
python3 - "$tmpdir" $N > "$tmpdir/many.table" <<'EOF'
import sys
d, n = sys.argv[1], int(sys.argv[2])
print("# %d targets" % n)
for i in range(n):
    if i % 3 == 0:
        print("%d 1 linear %s/x.img %d" % (i, d, i // 3))
    elif i % 3 == 1:
        print("%d 1 linear %s/y.img %d" % (i, d, 8000 - i // 3))
    elif i % 30 == 2:
        print("%d 1 zero" % i)
    else:
        print("%d 1 linear %s/z.img %d" % (i, d, i // 3))
EOF

fill_random "$tmpdir/in.raw" $(( N * 512 )) 24
python3 - "$tmpdir/in.raw" $N <<'EOF'
import sys
p, n = sys.argv[1], int(sys.argv[2])
d = bytearray(open(p, "rb").read())
for i in range(2, n, 30):
    d[i * 512:(i + 1) * 512] = bytes(512)   # the zero targets
open(p, "wb").write(d)
EOF

# Reference of the device as it is now, from the backing files.
python3 - "$tmpdir" $N "$tmpdir/before.ref" <<'EOF'
import sys
d, n, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
x, y, z = (open("%s/%s.img" % (d, f), "rb").read() for f in "xyz")
S = 512
res = bytearray()
for i in range(n):
    if i % 3 == 0:
        res += x[(i // 3) * S:(i // 3 + 1) * S]
    elif i % 3 == 1:
        k = 8000 - i // 3
        res += y[k * S:(k + 1) * S]
    elif i % 30 == 2:
        res += bytes(S)
    else:
        res += z[(i // 3) * S:(i // 3 + 1) * S]
open(out, "wb").write(res)
EOF

mapper -U - "$tmpdir/many.table" --run "
    nbdinfo --size \"\$uri\" > '$tmpdir/size' &&
    nbdcopy \"\$uri\" '$tmpdir/before.raw' &&
    nbdcopy --connections=4 --request-size=65536 '$tmpdir/in.raw' \"\$uri\" &&
    nbdcopy --synchronous \"\$uri\" '$tmpdir/after.raw'" ||
    die "nbdcopy on the many-target device"
[ "$(cat "$tmpdir/size")" = $(( N * 512 )) ] || die "size"
cmp "$tmpdir/before.ref" "$tmpdir/before.raw" || die "device read differs from the table"
cmp "$tmpdir/in.raw" "$tmpdir/after.raw" || die "device read back differs"

# The backing files now hold in.raw, scattered as the table says.
python3 - "$tmpdir" $N "$tmpdir/after.ref" <<'EOF'
import sys
d, n, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
x, y, z = (open("%s/%s.img" % (d, f), "rb").read() for f in "xyz")
S = 512
inp = open(d + "/in.raw", "rb").read()
for i in range(n):
    s = inp[i * S:(i + 1) * S]
    if i % 3 == 0:
        assert x[(i // 3) * S:(i // 3 + 1) * S] == s, "x sector %d" % (i // 3)
    elif i % 3 == 1:
        k = 8000 - i // 3
        assert y[k * S:(k + 1) * S] == s, "y sector %d" % k
    elif i % 30 != 2:
        assert z[(i // 3) * S:(i // 3 + 1) * S] == s, "z sector %d" % (i // 3)
print("backing files ok")
EOF

echo "$0: ok"
