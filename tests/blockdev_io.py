# SPDX-License-Identifier: BSD-3-Clause
"""Block devices as backends (tests/test-blockdev.sh): reads, writes, zero,
trim, flush and extents through a device over loop devices; the
device's bytes are saved to OUT for the caller to compare with the
underlying files.

  python3 blockdev_io.py URI OUT
"""
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
print("blockdev_io.py: ok")
