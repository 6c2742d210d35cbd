# SPDX-License-Identifier: BSD-3-Clause
"""The error target (tests/test-error-target.sh): every request touching an
error range fails with EIO, the neighbours work up to the edges.

  python3 error_target.py URI
"""
import errno, sys
import nbd

h = nbd.NBD()
h.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
h.connect_uri(sys.argv[1])
S = 512
size = h.get_size()
assert size == 211 * S, size
E1, E1end = 100 * S, 110 * S
E2, E2end = 200 * S, 201 * S

def expect_eio(what, fn, *args):
    try:
        fn(*args)
    except nbd.Error as ex:
        # Depending on the libnbd version, errno is a name or a number.
        if ex.errno not in (errno.EIO, "EIO"):
            raise SystemExit("%s: failed with errno %r (%s), expected EIO"
                             % (what, ex.errno, ex))
        return
    raise SystemExit("%s: succeeded, expected EIO" % what)

# (offset, count) ranges inside or partly overlapping the error targets.
bad = [(E1, 1), (E1, E1end - E1), (E1end - 1, 1), (E1 - 1, 2), (E1end - 1, 2),
       (E1 + 7, 13), (0, size), (E1 - 4096, 8192), (E1end - 100, 5000),
       (E2, S), (E2 - 1, 2), (E2end - 1, 2), (E2 + 1, 1), (E2 - 3000, 6000)]
for off, n in bad:
    expect_eio("pread %d+%d" % (off, n), h.pread, n, off)
    expect_eio("pwrite %d+%d" % (off, n), h.pwrite, b"\xaa" * n, off)
    expect_eio("pwrite fua %d+%d" % (off, n), h.pwrite, b"\xaa" * n, off,
               nbd.CMD_FLAG_FUA)
    expect_eio("zero %d+%d" % (off, n), h.zero, n, off)
    expect_eio("zero no_hole %d+%d" % (off, n), h.zero, n, off,
               nbd.CMD_FLAG_NO_HOLE)
    expect_eio("trim %d+%d" % (off, n), h.trim, n, off)
    # The connection is still usable after each failure.
    assert h.pread(1, 0) is not None

# Neighbours work, right up to the edges.
h.pwrite(b"L" * 10, E1 - 10)
assert h.pread(10, E1 - 10) == b"L" * 10
assert h.pread(E1, 0)[-10:] == b"L" * 10
assert h.pread(5, E1end) == bytes(5)          # the zero target
h.pwrite(b"Z" * 5, E1end)                     # dropped
assert h.pread(5, E1end) == bytes(5)
h.pwrite(b"M" * 3, E2 - 3)
h.pwrite(b"N" * 3, E2end)
assert h.pread(3, E2 - 3) == b"MMM"
assert h.pread(3, E2end) == b"NNN"
h.zero(3, E2end)
assert h.pread(3, E2end) == bytes(3)
h.flush()
print("error_target.py: ok")
h.shutdown()
