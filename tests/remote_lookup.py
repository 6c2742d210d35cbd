# SPDX-License-Identifier: BSD-3-Clause
"""A host name looked up again at reconnect (tests/test-remote-lookup.sh):
while the lookup is held by the DNS server (fake_dns.py), the other
device still serves and a read on the one being looked up waits.

  python3 remote_lookup.py DIR NS   (DIR/m.sock the mapper, DIR/slow the
                                     backend in network namespace NS)
"""
import os, sys
import nbd
from nbdcheck import (aio_wait, connect, kill_server, start_server, until,
                      when_back)
d, ns = sys.argv[1], sys.argv[2]
sock = d + "/m.sock"
fast, slow = connect(sock, "fast"), connect(sock, "slow")

# 1. Both work.
fast.pwrite(b"f" * 4096, 0)
slow.pwrite(b"s" * 4096, 0)
assert fast.pread(4096, 0) == b"f" * 4096
assert slow.pread(4096, 0) == b"s" * 4096
print("1: both devices work")

# 2. The DNS server holds queries; slow's server goes away.
open(d + "/hold", "w").close()
kill_server(d, "slow")
until(lambda: os.path.exists(d + "/held"),
      "the mapper never looked backend.test up again", 30)
print("2: the reconnect's lookup of backend.test is held")

# 3. fast still serves while the lookup is held; a read on slow waits
#    for the name (remote-timeout=60: it neither fails nor completes).
sbuf = nbd.Buffer(4096)
scookie = slow.aio_pread(sbuf, 0)
buf = nbd.Buffer(4096)
cookie = fast.aio_pread(buf, 0)
assert aio_wait(fast, cookie, 20,
                "fast stalled while a host name was being looked up") == 0
assert buf.to_bytearray() == b"f" * 4096
assert os.path.exists(d + "/hold") and os.path.exists(d + "/held")
slow.poll(500)                  # take in a reply, if there is one
assert not slow.aio_command_completed(scookie), \
    "a read on slow completed while its host name was held"
print("3: fast served a read while the lookup was held; slow's read waits")

# 4. Answers again, the server is back: slow works (empty: memory), the
#    waiting read included.
os.unlink(d + "/hold")
start_server(d, "slow", ["-i", "127.0.0.1", "-p", "10809", "memory", "1M"],
             wrap=["ip", "netns", "exec", ns])
assert aio_wait(slow, scookie, 60, "slow's waiting read never completed") == 0
assert sbuf.to_bytearray() == bytes(4096)
when_back(slow.pread, 4096, 0, seconds=60)
slow.pwrite(b"t" * 4096, 0)
assert slow.pread(4096, 0) == b"t" * 4096
print("4: slow is back")
