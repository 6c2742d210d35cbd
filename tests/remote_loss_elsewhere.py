# SPDX-License-Identifier: BSD-3-Clause
"""A restarted backend loses the writes acknowledged on every connection
(tests/test-remote-loss-elsewhere.sh): with the connection holding the
write silent (nbd_proxy.py) and the other reconnected to the new server,
the next flush fails with EIO.

  python3 remote_loss_elsewhere.py UNIXSOCKET DIR   (DIR/ctl: the proxy's)
"""
import os, sys
import nbd
from nbdcheck import aio_wait, connect, fails_eio, restart_server, until

sock, d = sys.argv[1:3]
ctl = d + "/ctl"

def value(name):
    try:
        return int(open(os.path.join(ctl, name)).read())
    except FileNotFoundError:
        return 0

def ups(i):
    return open(d + "/mapper.log").read().count("connection %d -> up" % i)

h = connect(sock)
h.pwrite(b"A" * 4096, 0)
h.flush()
until(lambda: ups(0) >= 1 and ups(1) >= 1, "the connections did not come up")
# Reads and writes go to connection 1 first (pick_conn).
before = value("sent-1")
h.pwrite(b"W" * 4096, 8192)                 # acknowledged, not flushed
assert value("sent-1") - before >= 4096, "the write did not go to connection 1"

# Connection 1 goes silent, the server restarts: connection 0 is found
# dead at once and reconnects to the new server.
open(ctl + "/freeze-1", "w").close()
until(lambda: value("frozen-1"), "the proxy did not freeze connection 1")
restart_server(d, "r", ["memory", "16M"])
until(lambda: ups(0) >= 2, "connection 0 did not come back")

# Fill connection 1 (32 commands, SPILL) so that the flush goes to
# connection 0, the new server.
bufs = [nbd.Buffer(4096) for i in range(32)]
cookies = [h.aio_pread(b, (64 + i) * 4096) for i, b in enumerate(bufs)]
until(lambda: value("held-1") >= 32 * 28, "the reads did not reach "
      "connection 1")
assert fails_eio(h.flush), \
    "flush succeeded, but the write acknowledged before it is gone"
for c in cookies:
    aio_wait(h, c)                          # retried on connection 0
lost = h.pread(4096, 8192) != b"W" * 4096
print("the write is %s" % ("gone, and the flush said so" if lost
                           else "still there"))
h.flush()
h.shutdown()
