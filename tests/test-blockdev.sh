#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Block devices as backends (loop devices over files in the scratch dir):
# size checks, reads, writes, zero, trim, flush, extents, and the data
# landing in the right place of the underlying files.
source "${top_srcdir:-$(dirname "$0")/..}/tests/functions.sh"

requires nbdkit --version
requires python3 -c 'import nbd'
requires losetup --version
requires blockdev --version

for f in l0 l1; do
    mkfile $f.img 4M >/dev/null
    fill_random "$tmpdir/$f.img" $(( 4 * 1048576 )) $RANDOM
    cp "$tmpdir/$f.img" "$tmpdir/$f.orig"
done
loops=()
detach () { local l; for l in "${loops[@]}"; do losetup -d "$l" 2>/dev/null || :; done; }
cleanup_fn detach
for f in l0 l1; do
    if ! l=$(loop_attach "$tmpdir/$f.img" 2> "$tmpdir/loop.err"); then
        echo "$0: skipped: cannot attach a loop device: $(cat "$tmpdir/loop.err")"
        exit 77
    fi
    loops+=("$l")
done
L0=${loops[0]} L1=${loops[1]}
echo "loop devices: $L0 $L1"
[ "$(blockdev --getsize64 "$L0")" -eq $(( 4 * 1048576 )) ] || die "loop size"

# 4M = 8192 sectors per device.
cat > "$tmpdir/blk.table" <<EOF
0    1000 linear $L0 100
1000 2000 striped 2 5 $L0 2000 $L1 0
3000 1000 linear $L1 7000
EOF
# An area past the end of a block device is refused.
printf '0 200 linear %s 8000\n' "$L1" > "$tmpdir/past.table"
if mapper -U "$tmpdir/past.sock" "$tmpdir/past.table" --run true 2> "$tmpdir/past.err"; then
    die "area beyond the end of a block device accepted"
fi
cat "$tmpdir/past.err"
grep -q 'past\.table:1:' "$tmpdir/past.err" || die "no FILE:LINE: in message"

mapper -U - "$tmpdir/blk.table" \
       --run "python3 '$top_srcdir/tests/blockdev_io.py' \"\$uri\" '$tmpdir/dev.out'" ||
    die "block device backend"
detach
loops=()

# The files under the loop devices hold the device's data at the right
# places, and nothing else changed.
python3 - "$tmpdir" <<'EOF'
import sys
d = sys.argv[1]
S = 512
dev = open(d + "/dev.out", "rb").read()
l0 = bytearray(open(d + "/l0.orig", "rb").read())
l1 = bytearray(open(d + "/l1.orig", "rb").read())
l0[100 * S:1100 * S] = dev[0:1000 * S]
C = 5 * S
for c in range(2000 // 5):
    src = dev[1000 * S + c * C:1000 * S + (c + 1) * C]
    row = c // 2
    if c % 2 == 0:
        l0[2000 * S + row * C:2000 * S + (row + 1) * C] = src
    else:
        l1[row * C:(row + 1) * C] = src
l1[7000 * S:8000 * S] = dev[3000 * S:4000 * S]
assert open(d + "/l0.img", "rb").read() == bytes(l0), "l0.img"
assert open(d + "/l1.img", "rb").read() == bytes(l1), "l1.img"
print("underlying files ok")
EOF

echo "$0: ok"
