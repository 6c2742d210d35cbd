# SPDX-License-Identifier: BSD-3-Clause
"""remote-timeout (tests/test-remote-timeout.sh): a dead backend and a
stalled one fail their requests with EIO within the limit; the local
device goes on.

  python3 remote_timeout.py UNIXSOCKET DIR   (the backends: DIR/gone, slow)
"""
import sys, time
import nbd
from nbdcheck import connect, fails_eio, kill_server
sock, d = sys.argv[1:3]
gone, slow, local = [connect(sock, n) for n in ("gone", "slow", "local")]

gone.pwrite(b"g" * 512, 0)
local.pwrite(b"l" * 512, 0)
kill_server(d, "gone")
t = time.monotonic()
assert fails_eio(gone.pread, 512, 0), "read from a dead backend worked"
print("dead backend: EIO after %.1fs" % (time.monotonic() - t))
assert local.pread(512, 0) == b"l" * 512      # the rest still works
t = time.monotonic()
assert fails_eio(gone.pwrite, b"x" * 512, 512)
print("still dead: EIO after %.1fs" % (time.monotonic() - t))
# Block status over it does not fail (that fails a client's whole map):
# all data, since reads there fail.
m = nbd.NBD()
m.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
m.connect_uri("nbd+unix:///gone?socket=%s" % sock)
got = []
def extent(ctx, off, entries, err):
    if ctx == nbd.CONTEXT_BASE_ALLOCATION:
        got.extend(entries)
    return 0
m.block_status(1 << 20, 0, extent)
assert got == [1 << 20, 0], "block status over a dead backend: %r" % got
m.shutdown()

# Stalled: the read waits 20 s at the server; ours gives up first.
slow.pwrite(b"s" * 512, 0)
t = time.monotonic()
assert fails_eio(slow.pread, 512, 0), "stalled read did not fail"
print("stalled read: EIO after %.1fs" % (time.monotonic() - t))
slow.pwrite(b"t" * 512, 512)                  # a new connection serves it
local.pwrite(b"m" * 512, 512)
assert local.pread(1024, 0) == b"l" * 512 + b"m" * 512
for h in (gone, slow, local):
    h.shutdown()
print("remote_timeout.py: ok")
