# SPDX-License-Identifier: BSD-3-Clause
"""Requests beyond the end of a device fail and never touch the backing
files; requests up to the last byte work (tests/test-beyond-end.sh).

  python3 beyond_end.py UNIXSOCKET
"""
import sys
import nbd

def run(uri, expect_size, zero_prefix):
    h = nbd.NBD()
    h.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
    h.connect_uri(uri)
    size = h.get_size()
    assert size == expect_size, (size, expect_size)
    # Let the requests reach the server: no client-side bounds checks.
    h.set_strict_mode(0)
    bad = [(size, 1), (size - 1, 2), (size, 4096), (0, size + 1),
           (size + 512, 512), (size + 1000000, 1), (size - 512, 1024)]
    for off, n in bad:
        for what, fn in (("pread", lambda: h.pread(n, off)),
                         ("pwrite", lambda: h.pwrite(b"\xee" * n, off)),
                         ("pwrite fua", lambda: h.pwrite(b"\xee" * n, off,
                                                         nbd.CMD_FLAG_FUA)),
                         ("zero", lambda: h.zero(n, off)),
                         ("zero no_hole", lambda: h.zero(n, off,
                                                         nbd.CMD_FLAG_NO_HOLE)),
                         ("trim", lambda: h.trim(n, off)),
                         ("block_status", lambda: h.block_status(
                             n, off, lambda *a: 0))):
            try:
                fn()
            except nbd.Error:
                continue
            raise SystemExit("%s %d+%d beyond the end (size %d) succeeded"
                             % (what, off, n, size))
        # The connection survives.
        h.pread(1, 0)
    # Up to the very last byte works.
    h.set_strict_mode(nbd.STRICT_MASK)
    data = bytes((i * 7 + 3) & 0xff for i in range(size))
    h.pwrite(data, 0)
    h.pwrite(b"\x5a", size - 1)
    h.pwrite(b"\x5b\x5c", size - 2, nbd.CMD_FLAG_FUA)
    data = bytes(zero_prefix) + data[zero_prefix:-2] + b"\x5b\x5c"
    assert h.pread(size, 0) == data
    assert h.pread(1, size - 1) == b"\x5c"
    h.block_status(1, size - 1, lambda *a: 0)
    h.flush()
    h.shutdown()

sock = sys.argv[1]
run("nbd+unix:///lin?socket=" + sock, 20 * 512, 0)
run("nbd+unix:///str?socket=" + sock, 13 * 512, 512)  # sector 0 is zero
print("beyond_end.py: ok")
