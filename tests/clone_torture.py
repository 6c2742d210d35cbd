# SPDX-License-Identifier: BSD-3-Clause
"""kill -9 torture for the clone target (test-clone-kill.sh): a writer
that flushes often while the clone hydrates, and a check after each
restart that every write acknowledged before a successful flush is
there, and that no page a flushed write covered holds the source's data
again (a late copy from the source over the client's write).

The device is cut into slots of 12 KiB (so they cross 8 KiB regions:
partial writes hydrate first, some cover a whole region); every write
fills a slot with a generation's pattern (slot, gen).  After each
successful flush the writer saves, per slot, the gen it had written
before that flush began ("flushed") and the highest gen ever written.
A page holds the source's page only while nothing was flushed to its
slot, else a gen between the flushed one and the highest.
"""
import json
import os
import random
import struct
import sys

import nbd

import nbdcheck

PAGE = 4096


def pattern(slot, gen, n):
    word = struct.pack("<QQ", slot + 1, gen)
    return (word * (n // len(word) + 1))[:n]


def parse(page):
    slot, gen = struct.unpack_from("<QQ", page)
    return gen if gen and page == pattern(slot - 1, gen, len(page)) else None


def save(path, state):
    with open(path + ".tmp", "w") as f:
        json.dump(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.rename(path + ".tmp", path)


def writer(sock, name, slot_size, nslots, seed, path):
    rng = random.Random(seed)
    try:
        with open(path) as f:
            state = json.load(f)
    except FileNotFoundError:
        state = {"flushed": [0] * nslots, "written": [0] * nslots, "gen": 0}
    h = nbdcheck.connect(sock, name)
    written = list(state["flushed"])
    gen = max([state["gen"]] + state["written"])
    try:
        while True:
            for _ in range(rng.randrange(1, 8)):
                s = rng.randrange(nslots)
                gen += 1
                written[s] = gen
                state["written"][s] = gen
                save(path, state)
                flags = nbd.CMD_FLAG_FUA if rng.random() < 0.1 else 0
                h.pwrite(pattern(s, gen, slot_size), s * slot_size, flags)
            before = list(written)
            h.flush()
            state["flushed"] = before
            state["gen"] = gen
            save(path, state)
    except nbd.Error as e:
        print("writer stopped: %s" % e)


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
