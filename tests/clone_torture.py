# SPDX-License-Identifier: BSD-3-Clause
"""kill -9 torture for the clone target (test-clone-kill.sh): a writer
that flushes often while the clone hydrates, and a check after each
restart that every write acknowledged before a successful flush is
there, and that no page a flushed write covered holds the source's data
again (a late copy from the source over the client's write).

The device is cut into slots of 12 KiB (so they cross 8 KiB regions:
partial writes hydrate first, some cover a whole region); every write
fills a slot with a generation's pattern (slot, gen).  After each
successful flush the writer (thin_torture.py's) saves, per slot, the gen
it had written before that flush began ("flushed") and the highest gen
ever written.
A page holds the source's page only while nothing was flushed to its
slot, else a gen between the flushed one and the highest.
"""
import json
import struct
import sys

import nbdcheck
from thin_torture import PAGE, pattern, writer


def parse(page):
    """The gen of a pattern page, or None (the source's data, zeros)."""
    slot, gen = struct.unpack_from("<QQ", page)
    return gen if gen and page == pattern(slot - 1, gen, len(page)) else None


def check(sock, name, slot_size, nslots, path, source):
    with open(path) as f:
        state = json.load(f)
    src = open(source, "rb").read()
    h = nbdcheck.connect(sock, name)
    for s in range(nslots):
        data = h.pread(slot_size, s * slot_size)
        lo, hi = state["flushed"][s], state["written"][s]
        for p in range(0, slot_size, PAGE):
            page = data[p:p + PAGE]
            off = s * slot_size + p
            if page == src[off:off + PAGE]:
                assert lo == 0, "slot %d page %d: the source's data over " \
                    "flushed gen %d" % (s, p, lo)
                continue
            g = parse(page)
            assert g is not None, "slot %d page %d: neither the source " \
                "nor a pattern" % (s, p)
            assert lo <= g <= hi, "slot %d page %d: gen %d, flushed %d, " \
                "written %d" % (s, p, g, lo, hi)
    print("all %d slots hold their flushed writes" % nslots)


if __name__ == "__main__":
    cmd, sock, name, slot_size, nslots = sys.argv[1:6]
    if cmd == "write":
        writer(sock, name, int(slot_size), int(nslots), int(sys.argv[6]),
               sys.argv[7])
    else:
        check(sock, name, int(slot_size), int(nslots), sys.argv[6],
              sys.argv[7])
