# SPDX-License-Identifier: BSD-3-Clause
"""kill -9 torture for thin volumes (test-thin-kill.sh): a writer that
flushes often, and a check after the restart that every write
acknowledged before a successful flush is there.

The volume is cut into slots, each inside one data block; every write
fills a slot with a generation's pattern (slot, gen).  After each
successful flush the writer saves, per slot, the gen it had written
before that flush began ("flushed") and the highest gen ever written.
After the restart, every 4 KiB page of a slot holds the pattern of a gen
between its flushed gen and its highest (zeros only where nothing was
flushed): a page may be newer than the flush, never older.
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
    if page == bytes(len(page)):
        return 0
    slot, gen = struct.unpack_from("<QQ", page)
    return gen if page == pattern(slot - 1, gen, len(page)) else None


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
    # What this run's flushes make durable: the writes it makes, and of
    # the previous run's only what its last flush covered (those after it
    # may or may not have landed: state["written"] keeps their bound).
    # Gens stay unique across runs.
    written = list(state["flushed"])
    gen = max([state["gen"]] + state["written"])
    try:
        while True:
            for _ in range(rng.randrange(1, 8)):
                s = rng.randrange(nslots)
                gen += 1
                written[s] = gen
                state["written"][s] = gen
                # highest gen first, so that it is saved before the write
                # can land
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


def check(sock, name, slot_size, nslots, path):
    with open(path) as f:
        state = json.load(f)
    h = nbdcheck.connect(sock, name)
    for s in range(nslots):
        data = h.pread(slot_size, s * slot_size)
        lo, hi = state["flushed"][s], state["written"][s]
        for p in range(0, slot_size, PAGE):
            g = parse(data[p:p + PAGE])
            assert g is not None, "slot %d page %d: not a pattern" % (s, p)
            assert (g == 0 and lo == 0) or lo <= g <= hi, \
                "slot %d page %d: gen %d, flushed %d, written %d" % (
                    s, p, g, lo, hi)
    print("all %d slots hold their flushed writes" % nslots)


if __name__ == "__main__":
    cmd, sock, name, slot_size, nslots = sys.argv[1:6]
    if cmd == "write":
        writer(sock, name, int(slot_size), int(nslots), int(sys.argv[6]),
               sys.argv[7])
    else:
        check(sock, name, int(slot_size), int(nslots), sys.argv[6])
