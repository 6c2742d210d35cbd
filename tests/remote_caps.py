# SPDX-License-Identifier: BSD-3-Clause
"""What a remote backend can't do (tests/test-remote-caps.sh): a read-only
server makes the device read-only (EPERM); a server without
write-zeroes, FUA or extents still gets zeroes (written), FUA writes (a
flush) and extents (all data); fast zero is not offered.

  python3 remote_caps.py UNIXSOCKET PLAIN-URI
"""
import errno, sys
import nbd
sock, plain_uri = sys.argv[1:3]
def conn(name):
    h = nbd.NBD()
    h.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
    h.connect_uri("nbd+unix:///%s?socket=%s" % (name, sock))
    return h
ro = conn("ro")
assert ro.is_read_only()
assert ro.pread(512, 0) == bytes(512)
# libnbd refuses to send a write to a read-only export; so does nbdkit
# to a raw client: check the error both ways.
try:
    ro.pwrite(b"x", 0)
    raise SystemExit("write to a read-only device worked")
except nbd.Error as e:
    assert e.errnum == errno.EPERM, e
ro.set_strict_mode(0)
try:
    ro.pwrite(b"x", 0)
    raise SystemExit("write to a read-only device worked")
except nbd.Error as e:
    assert e.errnum == errno.EPERM, e

plain = conn("plain")
assert not plain.is_read_only()
assert plain.can_zero() and not plain.can_fast_zero()
assert plain.can_fua()
plain.pwrite(b"z" * 8192, 4096)
plain.zero(4096, 6144)                 # emulated: zeroes written
assert plain.pread(8192, 4096) == b"z" * 2048 + bytes(4096) + b"z" * 2048
plain.pwrite(b"f" * 512, 0, nbd.CMD_FLAG_FUA)
plain.zero(512, 512, nbd.CMD_FLAG_FUA)
plain.trim(512, 8192)
exts = []
plain.block_status(2048 * 512, 0,
                   lambda ctx, off, entries, err: exts.extend(entries))
assert exts == [2048 * 512, 0], exts  # all data
d = nbd.NBD()
d.connect_uri(plain_uri)
assert d.pread(1024, 0) == b"f" * 512 + bytes(512)
for h in (ro, plain, d):
    h.shutdown()
print("remote_caps.py: ok")
