# SPDX-License-Identifier: BSD-3-Clause
"""Remote backends (tests/test-remote-basic.sh): data written through the
mapper read back from the servers A, B and Q directly and the other way,
at every edge; zero, trim, FUA, flush and extents pass through.

  python3 remote_basic.py UNIXSOCKET A-URI B-URI Q-URI
"""
import sys
import nbd
S = 512
sock, A, B, Q = sys.argv[1:5]
def conn(uri):
    h = nbd.NBD()
    h.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
    h.connect_uri(uri)
    return h
dev = conn("nbd+unix:///dev?socket=" + sock)
alias = conn("nbd+unix:///alias?socket=" + sock)
a, b, q = conn(A), conn(B), conn(Q)
assert dev.get_size() == 10240 * S
assert dev.can_multi_conn() and dev.can_fua() and dev.can_zero()

# Across the A|B edge (device sector 4096) and the B|Q edge (8192).
pat = bytes(range(256)) * 16
dev.pwrite(pat, 4096 * S - 1000)
assert a.pread(1000, 8192 * S - 1000) == pat[:1000]
assert b.pread(len(pat) - 1000, 0) == pat[1000:]
dev.pwrite(b"Q" * 3000, 8192 * S - 10, nbd.CMD_FLAG_FUA)
assert b.pread(10, 4096 * S - 10) == b"Q" * 10
assert q.pread(2990, 2048 * S) == b"Q" * 2990
# The other way: written on the servers, read through the mapper.
a.pwrite(b"x" * 512, 8191 * S); b.pwrite(b"y" * 512, 0)
assert dev.pread(1024, 4096 * S - 512) == b"x" * 512 + b"y" * 512
assert alias.pread(512, 8191 * S) == b"x" * 512
# A big request over all three servers at once.
big = bytes([7]) * (10240 * S)
dev.pwrite(big, 0)
assert dev.pread(len(big), 0) == big
assert q.pread(4096, 2048 * S) == bytes([7]) * 4096
dev.flush()
# Zero and trim across edges; extents come from the servers.
dev.zero(2 * 4096 * S, 2048 * S)
assert dev.pread(2 * 4096 * S, 2048 * S) == bytes(2 * 4096 * S)
assert a.pread(S, 4096 * S + 2048 * S) == bytes(S)
dev.zero(S, 4096 * S, nbd.CMD_FLAG_FAST_ZERO)
dev.trim(4096 * S, 4096 * S)
exts = []
def cb(ctx, off, entries, err):
    exts.extend(entries)
alias.block_status(8192 * S, 0, cb)
assert sum(exts[0::2]) >= 4096 * S, exts
assert any(f & 1 for f in exts[1::2]), exts     # a hole somewhere
dev.flush()
for h in (dev, alias, a, b, q):
    h.shutdown()
print("remote_basic.py: ok")
