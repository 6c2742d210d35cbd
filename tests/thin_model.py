# SPDX-License-Identifier: BSD-3-Clause
"""A model of a thin pool and its volumes, and a random workload checked
against it through the server (the thin tests; see test-thin-model.sh).

The model keeps every volume's bytes and, per block, an abstract data
block id: a snapshot shares its origin's ids, a write or zero to a block
whose id another volume shares gets a new one (copy on write), a write to
an unprovisioned block gets a new one, write zeroes leaves an
unprovisioned block unprovisioned, a discard unmaps whole blocks only.
So it predicts each volume's bytes, its mapped blocks and the pool's used
data blocks exactly, and thin_dump's mappings (see dump_counts).
"""
import json
import os
import random
import subprocess
import sys
import xml.etree.ElementTree as ET

import nbd

import nbdcheck


class Pool:
    def __init__(self, block):
        self.block = block
        self.vols = {}          # dev id -> Vol
        self.next_block = 0

    def new_block(self):
        self.next_block += 1
        return self.next_block

    def refs(self, bid):
        return sum(1 for v in self.vols.values()
                   for b in v.map.values() if b == bid)

    def used(self):
        return len({b for v in self.vols.values() for b in v.map.values()})


class Vol:
    def __init__(self, pool, dev_id, size):
        self.pool = pool
        self.id = dev_id
        self.size = size
        self.data = bytearray(size)
        self.map = {}           # vblock -> abstract data block id

    def _blocks(self, off, n):
        bs = self.pool.block
        return range(off // bs, (off + n + bs - 1) // bs)

    def write(self, off, buf):
        self.data[off:off + len(buf)] = buf
        for vb in self._blocks(off, len(buf)):
            b = self.map.get(vb)
            if b is None or self.pool.refs(b) > 1:
                self.map[vb] = self.pool.new_block()

    def zero(self, off, n):
        self.data[off:off + n] = bytes(n)
        for vb in self._blocks(off, n):
            b = self.map.get(vb)
            if b is not None and self.pool.refs(b) > 1:
                self.map[vb] = self.pool.new_block()

    def trim(self, off, n):
        bs = self.pool.block
        first = (off + bs - 1) // bs
        last = (off + n) // bs
        for vb in range(first, last):
            self.data[vb * bs:(vb + 1) * bs] = bytes(bs)
            self.map.pop(vb, None)

    def snapshot(self, dev_id):
        v = Vol(self.pool, dev_id, self.size)
        v.data[:] = self.data
        v.map = dict(self.map)
        return v


def ms(*args):
    """nbdmsetup ARGS (NBDMSETUP and NBDMSETUP_URI from the environment)."""
    subprocess.run([os.environ["NBDMSETUP"]] + [str(a) for a in args],
                   check=True)


def status(dev):
    out = subprocess.run([os.environ["NBDMSETUP"], "status", dev],
                         check=True, capture_output=True, text=True)
    return out.stdout.split()


class Workload:
    """The pool device POOL on the server at SOCK, volumes named
    POOL-tID of SIZE bytes."""

    def __init__(self, sock, pool, block, size, rng, max_vols=6):
        self.sock = sock
        self.pool_name = pool
        self.model = Pool(block)
        self.size = size
        self.rng = rng
        self.max_vols = max_vols
        self.handles = {}
        self.next_id = 1
        self.ops = 0

    def name(self, dev_id):
        return "%s-t%d" % (self.pool_name, dev_id)

    def table(self, dev_id):
        return "0 %d thin mapper:%s %d" % (self.size // 512, self.pool_name,
                                           dev_id)

    def attach(self, dev_id):
        ms("create", self.name(dev_id), "--table", self.table(dev_id))
        self.handles[dev_id] = nbdcheck.connect(self.sock, self.name(dev_id))

    def detach(self, dev_id):
        self.handles.pop(dev_id).shutdown()
        ms("remove", self.name(dev_id))

    def create_thin(self):
        i = self.next_id
        self.next_id += 1
        ms("message", self.pool_name, 0, "create_thin", i)
        self.model.vols[i] = Vol(self.model, i, self.size)
        self.attach(i)

    def create_snap(self, origin):
        i = self.next_id
        self.next_id += 1
        # As dm asks: the origin is suspended while its snapshot is taken.
        ms("suspend", self.name(origin))
        ms("message", self.pool_name, 0, "create_snap", i, origin)
        ms("resume", self.name(origin))
        self.model.vols[i] = self.model.vols[origin].snapshot(i)
        self.attach(i)

    def delete(self, dev_id):
        self.detach(dev_id)
        ms("message", self.pool_name, 0, "delete", dev_id)
        del self.model.vols[dev_id]

    def reattach_all(self):
        for i in self.model.vols:
            self.handles[i] = nbdcheck.connect(self.sock, self.name(i))

    def rand_range(self):
        sizes = [1, 511, 512, 4096, 65535, 65536, 65537, 100000, 200000,
                 300000]
        n = min(self.rng.choice(sizes), self.size)
        off = self.rng.randrange(0, self.size - n + 1)
        if self.rng.random() < 0.3:     # block-aligned
            bs = self.model.block
            off = off // bs * bs
            n = min(n, self.size - off)
        return off, n

    def step(self):
        r = self.rng.random()
        vols = sorted(self.model.vols)
        v = self.rng.choice(vols)
        h = self.handles[v]
        vol = self.model.vols[v]
        off, n = self.rand_range()
        self.ops += 1
        if r < 0.40:
            buf = self.rng.randbytes(n)
            h.pwrite(buf, off, nbd.CMD_FLAG_FUA if self.rng.random() < 0.1
                     else 0)
            vol.write(off, buf)
        elif r < 0.50:
            h.zero(n, off)
            vol.zero(off, n)
        elif r < 0.60:
            h.trim(n, off)
            vol.trim(off, n)
        elif r < 0.65:
            h.flush()
        elif r < 0.71 and len(vols) < self.max_vols:
            self.create_snap(v)
        elif r < 0.75 and len(vols) > 1:
            self.delete(v)
        elif r < 0.78 and len(vols) < self.max_vols:
            self.create_thin()
        else:
            got = h.pread(n, off)
            assert got == vol.data[off:off + n], \
                "volume %d differs in [%d, +%d) after %d ops" % (
                    v, off, n, self.ops)

    def check_all(self):
        """Every volume byte for byte, its mapped count, and the pool's
        used data blocks."""
        bs = self.model.block
        for i, vol in self.model.vols.items():
            h = self.handles[i]
            for off in range(0, self.size, 1 << 20):
                n = min(1 << 20, self.size - off)
                got = h.pread(n, off)
                assert got == vol.data[off:off + n], \
                    "volume %d differs in [%d, +%d)" % (i, off, n)
            st = status(self.name(i))
            mapped = int(st[3]) // (bs // 512)
            assert mapped == len(vol.map), \
                "volume %d: status %s maps %d blocks, model %d" % (
                    i, st, mapped, len(vol.map))
        st = status(self.pool_name)
        used = int(st[5].split("/")[0])
        assert used == self.model.used(), \
            "pool status %s uses %d data blocks, model %d" % (
                st, used, self.model.used())

    def save(self, path):
        with open(path, "w") as f:
            json.dump({"block": self.model.block, "size": self.size,
                       "next_id": self.next_id,
                       "vols": {i: {"map": v.map, "data": v.data.hex()}
                                for i, v in self.model.vols.items()}}, f)

    def load(self, path):
        with open(path) as f:
            s = json.load(f)
        self.next_id = s["next_id"]
        self.model.vols = {}
        for i, d in s["vols"].items():
            v = Vol(self.model, int(i), self.size)
            v.data[:] = bytes.fromhex(d["data"])
            v.map = {int(k): b for k, b in d["map"].items()}
            self.model.vols[int(i)] = v
            self.model.next_block = max([self.model.next_block] +
                                        list(v.map.values()))


def dump_counts(xml_text):
    """thin_dump's XML: {dev id: (mapped_blocks attribute, blocks its
    mappings cover)} and the set of data blocks mapped."""
    root = ET.fromstring(xml_text)
    devs, blocks = {}, set()
    for d in root.findall("device"):
        n = 0
        for m in d:
            if m.tag == "single_mapping":
                n += 1
                blocks.add(int(m.get("data_block")))
            elif m.tag == "range_mapping":
                k = int(m.get("length"))
                n += k
                b = int(m.get("data_begin"))
                blocks.update(range(b, b + k))
        devs[int(d.get("dev_id"))] = (int(d.get("mapped_blocks")), n)
    return devs, blocks


def check_dump(model_path, xml_path):
    """thin_dump (XML_PATH) against a saved model: the same devices, each
    with the model's number of mapped blocks, and as many distinct data
    blocks as the model uses."""
    w = Workload(None, None, 0, 0, None)
    with open(model_path) as f:
        s = json.load(f)
    w.size = s["size"]
    w.model.block = s["block"]
    w.load(model_path)
    with open(xml_path) as f:
        devs, blocks = dump_counts(f.read())
    assert set(devs) == set(w.model.vols), \
        "thin_dump devices %s, model %s" % (sorted(devs), sorted(w.model.vols))
    for i, (attr, n) in devs.items():
        want = len(w.model.vols[i].map)
        assert attr == n == want, \
            "device %d: thin_dump mapped_blocks=%d, mappings %d, model %d" % (
                i, attr, n, want)
    assert len(blocks) == w.model.used(), \
        "thin_dump maps %d data blocks, model %d" % (len(blocks),
                                                      w.model.used())


def main(argv):
    cmd = argv[1]
    if cmd == "check-dump":
        check_dump(argv[2], argv[3])
        return
    sock, pool, block, size, seed, nops, state = argv[2:9]
    w = Workload(sock, pool, int(block), int(size),
                 random.Random(int(seed)))
    if cmd == "run":
        # volume 1, created by the test (thin_pool)
        w.model.vols[1] = Vol(w.model, 1, w.size)
        w.next_id = 2
        w.attach(1)
        for _ in range(int(nops)):
            w.step()
        w.check_all()
        for h in w.handles.values():
            h.flush()
        w.save(state)
    elif cmd == "verify":
        w.load(state)
        w.reattach_all()
        w.check_all()
    print("thin workload %s: %d ops, %d volumes, %d data blocks used" % (
        cmd, w.ops, len(w.model.vols), w.model.used()))


if __name__ == "__main__":
    main(sys.argv)
