# SPDX-License-Identifier: BSD-3-Clause
"""Requests of 64 MiB and zero/trim of nearly 4 GiB over an 8 GiB device
(tests/test-large-requests.sh), and block status over all of it.

  python3 large_requests.py URI
"""
import random, sys
import nbd
S = 512
M = 1 << 20
h = nbd.NBD()
h.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
h.connect_uri(sys.argv[1])
size = h.get_size()
assert size == 16924660 * S, size
lin_end = 81920 * S
str_end = 131060 * S
tail = 16908276 * S
rng = random.Random(9)

# 64M write spanning linear -> striped -> zero, and 64M read back.
big = rng.randbytes(64 * M)
off = lin_end - 20 * M - 333
h.pwrite(big, off)
want = big[:str_end - off] + bytes(off + 64 * M - str_end)
assert h.pread(64 * M, off) == want, "64M read back"
# A write spanning striped -> zero (nothing written there).
w = rng.randbytes(8 * M)
h.pwrite(w, str_end - 4 * M - 1)
r = h.pread(8 * M, str_end - 4 * M - 1)
assert r[:4 * M + 1] == w[:4 * M + 1] and r[4 * M + 1:] == bytes(4 * M - 1)
# Near-4G zero and trim over the zero target, and over everything but the
# last linear target.
h.zero(0xffffffff - 511, str_end + 7)
h.trim(0xffffffff, str_end + 100)
h.zero(0xfffff000, 0, nbd.CMD_FLAG_NO_HOLE)
assert h.pread(4 * M, lin_end - 2 * M) == bytes(4 * M), "zeroed"
# The tail is still writable and separate.
t = rng.randbytes(8 * M)
h.pwrite(t, tail)
assert h.pread(8 * M, tail) == t
# Block status over the whole 8G+ device, a 4G-1 window at a time.
pos, hole_bytes = 0, 0
while pos < size:
    got = []
    def cb(ctx, offset, entries, err):
        if ctx == nbd.CONTEXT_BASE_ALLOCATION:
            got.extend(entries)
    n = min(0xffffffff, size - pos)
    h.block_status(n, pos, cb)
    assert got, pos
    for i in range(0, len(got), 2):
        k = min(got[i], size - pos)
        if got[i + 1] & nbd.STATE_HOLE:
            hole_bytes += k
        pos += k
        if pos >= size:
            break
# At least the 8G zero target is a hole.
assert hole_bytes >= 16777216 * S, hole_bytes
h.flush()
h.shutdown()
print("large_requests.py: ok")
