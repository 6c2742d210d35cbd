#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""An independent reader of dm-clone metadata, written from the format
as Linux's dm-clone-metadata.c, dm-bitset.c, dm-array.c, dm-btree and
the metadata space map lay it out (no code shared with server/pdata/):
no tool in thin-provisioning-tools 0.9 checks dm-clone metadata.

  clone_md.py check MD                print regions, hydrated, and the
                                      hydrated bitmap as ranges
  clone_md.py check MD --expect F     also: F is a file of region numbers
                                      (one per line, or "a-b") that must
                                      be hydrated; others may be either
  clone_md.py check MD --all          every region must be hydrated

Every block is checked: checksum (crc32c, dm's per-type salt), its own
block number, node and array headers; every reachable block is counted
in the metadata space map and the space map's allocated count matches.
Exit 0 if sound, 1 with a message naming the block otherwise.
"""
import struct
import sys

BLOCK = 4096
SB_XOR, BTREE_XOR, BITMAP_XOR, INDEX_XOR, ARRAY_XOR = (
    257649492, 121107, 240779, 160478, 595846735)
MAGIC = 0x8af27f64

_table = []
for i in range(256):
    c = i
    for _ in range(8):
        c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
    _table.append(c)


def crc32c(data, xor):
    c = 0xFFFFFFFF
    for b in data:
        c = _table[(c ^ b) & 0xFF] ^ (c >> 8)
    return (c ^ xor) & 0xFFFFFFFF


class Bad(Exception):
    pass


class Md:
    def __init__(self, path):
        with open(path, "rb") as f:
            self.data = f.read()
        self.nr_blocks = len(self.data) // BLOCK
        self.seen = {}

    def block(self, nr, xor, what, blocknr_at=8):
        if nr >= self.nr_blocks:
            raise Bad("%s: block %d past the device's %d" %
                      (what, nr, self.nr_blocks))
        b = self.data[nr * BLOCK:(nr + 1) * BLOCK]
        want = struct.unpack_from("<I", b, 0)[0]
        got = crc32c(b[4:], xor)
        if want != got:
            raise Bad("%s: block %d: checksum 0x%08x, computed 0x%08x" %
                      (what, nr, want, got))
        bn = struct.unpack_from("<Q", b, blocknr_at)[0]
        if bn != nr:
            raise Bad("%s: block %d says it is block %d" % (what, nr, bn))
        self.seen[nr] = self.seen.get(nr, 0) + 1
        return b

    def btree(self, root, value_size, what, depth=0):
        """Leaf entries (key, value bytes) in key order."""
        if depth > 16:
            raise Bad("%s: deeper than 16 levels (a loop?)" % what)
        b = self.block(root, BTREE_XOR, what)
        flags = struct.unpack_from("<I", b, 4)[0]
        n, mx, vs = struct.unpack_from("<III", b, 16)
        if flags not in (1, 2):
            raise Bad("%s: node %d: flags %d" % (what, root, flags))
        if n > mx or 32 + mx * (8 + vs) > BLOCK:
            raise Bad("%s: node %d: %d entries of max %d, value size %d" %
                      (what, root, n, mx, vs))
        keys = struct.unpack_from("<%dQ" % n, b, 32)
        if list(keys) != sorted(set(keys)):
            raise Bad("%s: node %d: keys out of order" % (what, root))
        vals = 32 + 8 * mx
        out = []
        if flags == 1:
            if vs != 8:
                raise Bad("%s: internal node %d: value size %d" %
                          (what, root, vs))
            for i in range(n):
                child = struct.unpack_from("<Q", b, vals + 8 * i)[0]
                out += self.btree(child, value_size, what, depth + 1)
        else:
            if vs != value_size:
                raise Bad("%s: leaf %d: value size %d, expected %d" %
                          (what, root, vs, value_size))
            for i in range(n):
                out.append((keys[i], b[vals + vs * i:vals + vs * (i + 1)]))
        return out

    def space_map(self, root):
        """{block: count} from the metadata space map root (128 bytes)."""
        nr, alloc, index, rc_root = struct.unpack_from("<QQQQ", root, 0)
        if nr == 0 or nr > self.nr_blocks:
            raise Bad("space map: %d blocks, the device has %d" %
                      (nr, self.nr_blocks))
        ib = self.block(index, INDEX_XOR, "space map index")
        per = (BLOCK - 16) * 4
        counts = {}
        for i in range((nr + per - 1) // per):
            bnr, nfree, _ = struct.unpack_from("<QII", ib, 16 + 16 * i)
            bm = self.block(bnr, BITMAP_XOR, "space map bitmap %d" % i)
            for j in range(min(per, nr - i * per)):
                byte = bm[16 + j // 4]
                sh = (j % 4) * 2
                v = ((byte >> sh) & 1) << 1 | ((byte >> (sh + 1)) & 1)
                if v:
                    counts[i * per + j] = v
        if rc_root:
            for k, v in self.btree(rc_root, 4, "space map ref counts"):
                counts[k] = struct.unpack("<I", v)[0]
        if len(counts) != alloc:
            raise Bad("space map: %d blocks counted, the root says %d "
                      "allocated" % (len(counts), alloc))
        return counts, nr, alloc


def read(path):
    md = Md(path)
    if md.nr_blocks < 1:
        raise Bad("no superblock")
    raw = md.data[:BLOCK]
    magic, version = struct.unpack_from("<QI", raw, 32)
    if magic != MAGIC:
        raise Bad("superblock: magic 0x%x, not dm-clone's 0x%x" %
                  (magic, MAGIC))
    sb = md.block(0, SB_XOR, "superblock")
    if version != 1:
        raise Bad("superblock: version %d" % version)
    sm_root = sb[44:172]
    region, target, bitset_root = struct.unpack_from("<QQQ", sb, 172)
    nr_regions = (target + region - 1) // region
    nr_words = (nr_regions + 63) // 64
    entries = md.btree(bitset_root, 8, "bitset btree")
    per = (BLOCK - 24) // 8
    want_blocks = (nr_words + per - 1) // per
    if [k for k, _ in entries] != list(range(want_blocks)):
        raise Bad("bitset btree: keys %s, expected 0..%d" %
                  ([k for k, _ in entries][:8], want_blocks - 1))
    bits = []
    for k, v in entries:
        ab = struct.unpack("<Q", v)[0]
        b = md.block(ab, ARRAY_XOR, "array block %d" % k, blocknr_at=16)
        mx, n, vs = struct.unpack_from("<III", b, 4)
        want_n = min(per, nr_words - k * per)
        if (mx, n, vs) != (per, want_n, 8):
            raise Bad("array block %d (block %d): max %d, entries %d, value "
                      "size %d; expected %d, %d, 8" %
                      (k, ab, mx, n, vs, per, want_n))
        for w in struct.unpack_from("<%dQ" % n, b, 24):
            bits += [(w >> i) & 1 for i in range(64)]
    if any(bits[nr_regions:]):
        raise Bad("bitset: bits set past region %d" % nr_regions)
    bits = bits[:nr_regions]
    counts, nr, alloc = md.space_map(sm_root)
    for blk, refs in md.seen.items():
        if counts.get(blk, 0) < 1:
            raise Bad("space map: block %d is in use but free" % blk)
    return {"region_sectors": region, "target_sectors": target,
            "regions": nr_regions, "bits": bits, "sm_blocks": nr,
            "sm_allocated": alloc, "reachable": len(md.seen)}


def ranges(bits):
    out, i = [], 0
    while i < len(bits):
        if bits[i]:
            j = i
            while j + 1 < len(bits) and bits[j + 1]:
                j += 1
            out.append("%d-%d" % (i, j) if j > i else "%d" % i)
            i = j + 1
        else:
            i += 1
    return out


def main():
    if len(sys.argv) < 3 or sys.argv[1] != "check":
        sys.exit(__doc__)
    try:
        m = read(sys.argv[2])
    except Bad as e:
        print("clone_md: %s: %s" % (sys.argv[2], e))
        sys.exit(1)
    h = sum(m["bits"])
    print("region_sectors %d target_sectors %d regions %d hydrated %d "
          "metadata %d/%d (%d reachable)" %
          (m["region_sectors"], m["target_sectors"], m["regions"], h,
           m["sm_allocated"], m["sm_blocks"], m["reachable"]))
    print("hydrated: %s" % " ".join(ranges(m["bits"])[:40]))
    args = sys.argv[3:]
    if "--all" in args and h != m["regions"]:
        print("clone_md: %d of %d regions hydrated, expected all" %
              (h, m["regions"]))
        sys.exit(1)
    if "--expect" in args:
        f = args[args.index("--expect") + 1]
        for line in open(f):
            line = line.strip()
            if not line:
                continue
            a, _, b = line.partition("-")
            for r in range(int(a), int(b or a) + 1):
                if not m["bits"][r]:
                    print("clone_md: region %d not hydrated, expected" % r)
                    sys.exit(1)


if __name__ == "__main__":
    main()
