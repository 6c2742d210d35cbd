#!/usr/bin/env bash
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
    if ! l=$(losetup -f --show "$tmpdir/$f.img" 2>/dev/null); then
        echo "$0: skipped: cannot attach a loop device"; exit 77
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

cat > "$tmpdir/blk.py" <<'EOF'
import errno, random, sys
import nbd
S = 512
h = nbd.NBD()
h.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
h.connect_uri(sys.argv[1])
size = h.get_size()
assert size == 4000 * S
assert not h.is_read_only()
rng = random.Random(4)
dev = bytearray(h.pread(size, 0))
def w(off, n, flags=0):
    d = rng.randbytes(n)
    h.pwrite(d, off, flags)
    dev[off:off + n] = d
for e in (1000, 1005, 1010, 2995, 3000):
    w(e * S - 3, 7)
    w(e * S - 700, 1400, nbd.CMD_FLAG_FUA)
w(0, size)
w(12345, 99999)
assert h.pread(size, 0) == bytes(dev), "read back"
for off, n, flags in ((1000 * S - 5, 3000, 0), (2990 * S + 1, 8000, nbd.CMD_FLAG_NO_HOLE),
                      (5, 70000, nbd.CMD_FLAG_FUA)):
    h.zero(n, off, flags)
    dev[off:off + n] = bytes(n)
    assert h.pread(size, 0) == bytes(dev), "after zero %d+%d" % (off, n)
if h.can_fast_zero():
    try:
        h.zero(4096, 8192, nbd.CMD_FLAG_FAST_ZERO)
        dev[8192:8192 + 4096] = bytes(4096)
    except nbd.Error as ex:
        assert ex.errno in (errno.ENOTSUP, errno.EOPNOTSUPP, "ENOTSUP", "EOPNOTSUPP"), ex
        h.zero(4096, 8192)
        dev[8192:8192 + 4096] = bytes(4096)
# Trim: neighbours unchanged; then rewrite.
h.trim(4 * S, 1500 * S + 3)
assert h.pread(100, 1500 * S + 3 - 100) == bytes(dev[1500 * S + 3 - 100:1500 * S + 3])
assert h.pread(100, 1504 * S + 3) == bytes(dev[1504 * S + 3:1504 * S + 103])
w(1500 * S + 3, 4 * S)
h.flush()
# Extents: anything reported as zero reads as zero.
got = []
h.block_status(size, 0, lambda ctx, off, ents, err: got.extend(ents) if ctx == nbd.CONTEXT_BASE_ALLOCATION else 0)
pos = 0
for i in range(0, len(got), 2):
    n = min(got[i], size - pos)
    if got[i + 1] & nbd.STATE_ZERO:
        assert h.pread(n, pos) == bytes(n), "zero extent %d+%d" % (pos, n)
    pos += n
open(sys.argv[2], "wb").write(dev)
h.shutdown()
print("blk.py: ok")
EOF

mapper -U - "$tmpdir/blk.table" \
       --run "python3 '$tmpdir/blk.py' \"\$uri\" '$tmpdir/dev.out'" ||
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
