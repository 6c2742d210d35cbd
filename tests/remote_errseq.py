# SPDX-License-Identifier: BSD-3-Clause
"""A remote backend's lost writes are reported to every client connection
open when they were lost, once each (tests/test-remote-errseq.sh).

  python3 remote_errseq.py UNIXSOCKET DIR FILE   (DIR/r: the backend, on FILE)
"""
import sys
from nbdcheck import connect, fails_eio, restart_server

sock, d, f = sys.argv[1:4]

def conn(name):
    return connect(sock, name)

def restart_backend():
    """kill -9 the backend, start a new one on the same socket."""
    restart_server(d, "r", ["file", f])

# --- every connection open at the loss hears of it, once ------------------
for dev in ("d", "up"):
    writer, other = conn(dev), conn(dev)
    writer.pwrite(b"W" * 4096, 0)           # acknowledged, not flushed
    restart_backend()
    assert writer.pread(4096, 0) == b"W" * 4096   # page cache: still there
    later = conn(dev)                       # opened after the loss
    # The other connection flushes first: it hears of the loss ...
    assert fails_eio(other.flush), dev + ": other: flush succeeded"
    other.flush()
    # ... and so does the writer, whose write it was.
    assert fails_eio(writer.flush), dev + ": writer: flush succeeded"
    writer.flush()
    later.flush()
    for h in (writer, other, later):
        h.shutdown()
    print(dev + ": each connection open at the loss failed one flush")

