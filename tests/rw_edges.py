# SPDX-License-Identifier: BSD-3-Clause
"""The model of tests/test-rw-edges.sh: reads, writes, zeroes, trims and
block status at every edge of a table, checked against an independent
model of where each byte lands, and finally byte for byte against the
backing files.

  python3 rw_edges.py MODE URI TABLE [SEED]
"""
import errno, os, random, sys
import nbd

SECTOR = 512
mode, uri, table = sys.argv[1], sys.argv[2], sys.argv[3]
seed = int(sys.argv[4]) if len(sys.argv) > 4 else 1
rng = random.Random(seed)

# --- parse the table (dmsetup syntax), independently of the plugin -------
segs = []        # (start_byte, length_byte, kind, info)
for line in open(table):
    words = line.split("#", 1)[0].split()
    if not words:
        continue
    start, length, target, args = int(words[0]), int(words[1]), words[2], words[3:]
    start *= SECTOR
    length *= SECTOR
    if target == "linear":
        segs.append((start, length, "linear", (args[0], int(args[1]) * SECTOR)))
    elif target == "striped":
        n, chunk = int(args[0]), int(args[1]) * SECTOR
        areas = [(args[2 + 2 * i], int(args[3 + 2 * i]) * SECTOR) for i in range(n)]
        segs.append((start, length, "striped", (n, chunk, areas)))
    elif target in ("zero", "error"):
        segs.append((start, length, target, None))
    else:
        raise SystemExit("model: unknown target " + target)
size = segs[-1][0] + segs[-1][1]

def pieces(off, count):
    """Yield (dev_off, n, kind, path, file_off) covering [off, off+count)."""
    end = off + count
    for start, length, kind, info in segs:
        lo, hi = max(off, start), min(end, start + length)
        if lo >= hi:
            continue
        if kind == "linear":
            path, foff = info
            yield (lo, hi - lo, "file", path, foff + lo - start)
        elif kind == "striped":
            n, chunk, areas = info
            pos = lo
            while pos < hi:
                rel = pos - start
                chunk_no, within = divmod(rel, chunk)
                stripe, row = chunk_no % n, chunk_no // n
                k = min(hi - pos, chunk - within)
                path, foff = areas[stripe]
                yield (pos, k, "file", path, foff + row * chunk + within)
                pos += k
        else:
            yield (lo, hi - lo, kind, None, None)

def edges():
    """Every target edge and every chunk edge, in device bytes."""
    e = set([0, size])
    for start, length, kind, info in segs:
        e.add(start)
        e.add(start + length)
        if kind == "striped":
            for x in range(start, start + length, info[1]):
                e.add(x)
    return sorted(e)

# --- model state: the expected contents of every backing file -----------
paths = sorted(set(p for s in segs if s[2] in ("linear", "striped")
                   for p in ([s[3][0]] if s[2] == "linear" else [a[0] for a in s[3][2]])))
files = {p: bytearray(open(p, "rb").read()) for p in paths}

def model_write(off, data):
    for d, n, kind, path, fo in pieces(off, len(data)):
        if kind == "file":
            files[path][fo:fo + n] = data[d - off:d - off + n]

def model_read(off, count):
    out = bytearray(count)
    for d, n, kind, path, fo in pieces(off, count):
        if kind == "file":
            out[d - off:d - off + n] = files[path][fo:fo + n]
    return bytes(out)

def first_diff(a, b):
    for i in range(min(len(a), len(b))):
        if a[i] != b[i]:
            return i
    return min(len(a), len(b))

def fail(msg):
    print("rw_edges.py: FAIL: " + msg, file=sys.stderr)
    sys.exit(1)

def check_read(h, off, count, what=""):
    off, end = max(0, off), min(size, off + count)
    if end <= off:
        return
    got = h.pread(end - off, off)
    want = model_read(off, end - off)
    if got != want:
        i = first_diff(got, want)
        fail("%s: read %d+%d differs at device byte %d (got %r, want %r)"
             % (what, off, end - off, off + i, got[i:i + 8], want[i:i + 8]))

def clip(off, count):
    off2, end = max(0, off), min(size, off + count)
    return off2, max(0, end - off2)

def do_write(h, off, count, flags=0, what="write"):
    off, count = clip(off, count)
    if count == 0:
        return
    data = rng.randbytes(count)
    h.pwrite(data, off, flags)
    model_write(off, data)
    check_read(h, off - 700, count + 1400, "%s %d+%d" % (what, off, count))

def do_zero(h, off, count, flags=0, what="zero"):
    off, count = clip(off, count)
    if count == 0:
        return
    h.zero(count, off, flags)
    model_write(off, bytes(count))
    check_read(h, off - 700, count + 1400, "%s %d+%d" % (what, off, count))

def do_trim(h, off, count):
    """Trim, then check everything around (not inside) the range, then
    write new data over it so the model knows the contents again."""
    off, count = clip(off, count)
    if count == 0:
        return
    h.trim(count, off)
    check_read(h, off - 700, 700, "before trim %d+%d" % (off, count))
    check_read(h, off + count, 700, "after trim %d+%d" % (off, count))
    do_write(h, off, count, 0, "rewrite after trim")

def compare_files(what):
    for p in paths:
        disk = open(p, "rb").read()
        if disk != bytes(files[p]):
            i = first_diff(disk, files[p])
            fail("%s: backing file %s differs from the model at byte %d "
                 "(disk %r, model %r); sizes %d/%d"
                 % (what, p, i, disk[i:i + 8], bytes(files[p][i:i + 8]),
                    len(disk), len(files[p])))

def connect():
    h = nbd.NBD()
    h.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
    h.connect_uri(uri)
    return h

# Relative (offset, length) patterns around an edge: unaligned, odd lengths.
AROUND = [(-1, 1), (0, 1), (-1, 2), (-1, 3), (-2, 5), (-3, 7), (-511, 1023),
          (-513, 1027), (-4097, 8195), (-1, 1537)]

def run_rw():
    h = connect()
    if h.get_size() != size:
        fail("size %d, model says %d" % (h.get_size(), size))
    for cap in ("can_flush", "can_trim", "can_zero", "can_fua", "can_multi_conn"):
        if not getattr(h, cap)():
            fail(cap + " is false")
    if h.is_read_only():
        fail("device is read-only")
    # The initial contents.
    check_read(h, 0, size, "initial")
    E = edges()
    # Plain and FUA writes at every edge.
    for flags, what in ((0, "write"), (nbd.CMD_FLAG_FUA, "fua write")):
        for e in E:
            for d, n in AROUND:
                do_write(h, e + d, n, flags, "%s at edge %d" % (what, e))
    h.flush()
    compare_files("after edge writes")
    # Random writes and reads of odd sizes anywhere.
    for i in range(300):
        off = rng.randrange(size)
        n = rng.choice([1, 2, 3, 511, 513, 1535, 1537, 4095, 4097,
                        rng.randrange(1, 20000)])
        do_write(h, off, n, nbd.CMD_FLAG_FUA if i % 7 == 0 else 0, "random write")
        a = rng.randrange(size)
        check_read(h, a, rng.randrange(1, 9000), "random read")
    # Reads at every edge.
    for e in E:
        for d, n in AROUND:
            check_read(h, e + d, n, "read at edge %d" % e)
    # One write of the whole device.
    do_write(h, 0, size, 0, "whole device write")
    h.flush()
    compare_files("after whole-device write")
    # Zero, with MAY_TRIM (no flag) and without (NO_HOLE), at every edge.
    for flags, what in ((0, "zero"), (nbd.CMD_FLAG_NO_HOLE, "zero no_hole"),
                        (nbd.CMD_FLAG_FUA, "zero fua")):
        for e in E:
            for d, n in ((-1, 2), (-3, 7), (-513, 1027), (-4097, 8195)):
                do_write(h, e + d - 10, n + 20, 0, "refill")
                do_zero(h, e + d, n, flags, "%s at edge %d" % (what, e))
    h.flush()
    compare_files("after zero")
    # FAST_ZERO: succeeds (and zeroes) or fails with ENOTSUP.
    if h.can_fast_zero():
        for e in E:
            off, n = clip(e - 700, 1401)
            if n == 0:
                continue
            do_write(h, off, n, 0, "refill")
            try:
                h.zero(n, off, nbd.CMD_FLAG_FAST_ZERO)
                model_write(off, bytes(n))
            except nbd.Error as ex:
                # errno is a name or a number depending on libnbd.
                if ex.errno not in (errno.ENOTSUP, errno.EOPNOTSUPP,
                                    "ENOTSUP", "EOPNOTSUPP"):
                    fail("fast zero %d+%d failed with %r, not ENOTSUP" % (off, n, ex))
                # The contents are unspecified now: zero them normally.
                do_zero(h, off, n, 0, "zero after failed fast zero")
            check_read(h, off - 700, n + 1400, "fast zero at edge %d" % e)
    # Trim at every edge: neighbours must be untouched.
    for e in E:
        for d, n in ((-1, 2), (-3, 7), (-513, 1027), (-4097, 8195)):
            do_trim(h, e + d, n)
    do_trim(h, 0, size)
    h.flush()
    compare_files("after trim")
    # multi-conn: a write flushed on one connection is seen by another.
    h2 = connect()
    for e in E:
        off, n = clip(e - 5, 11)
        if n == 0:
            continue
        data = rng.randbytes(n)
        h2.pwrite(data, off)
        model_write(off, data)
    h2.flush()
    check_read(h, 0, size, "after writes on a second connection")
    h2.shutdown()
    h.flush()
    compare_files("final")
    check_read(h, 0, size, "final")
    h.shutdown()

def expected_holes(off, count):
    """Yield (dev_off, n, is_hole) from the backing files' SEEK_HOLE map."""
    for d, n, kind, path, fo in pieces(off, count):
        if kind == "zero":
            yield (d, n, True)
            continue
        fd = os.open(path, os.O_RDONLY)
        try:
            pos, end = fo, fo + n
            while pos < end:
                try:
                    data = os.lseek(fd, pos, os.SEEK_DATA)
                except OSError as ex:
                    if ex.errno != errno.ENXIO:
                        raise
                    data = end
                if data > pos:
                    k = min(data, end) - pos
                    yield (d + pos - fo, k, True)
                    pos += k
                    continue
                hole = os.lseek(fd, pos, os.SEEK_HOLE)
                k = min(hole, end) - pos
                yield (d + pos - fo, k, False)
                pos += k
        finally:
            os.close(fd)

def block_status(h, off, count):
    """The server's extents over [off, off+count), as (dev_off, n, flags)."""
    out = []
    pos, end = off, off + count
    while pos < end:
        got = []
        def cb(metacontext, offset, entries, err):
            if metacontext == nbd.CONTEXT_BASE_ALLOCATION:
                got.extend(entries)
        h.block_status(end - pos, pos, cb)
        if not got:
            fail("block status %d+%d returned no extents" % (pos, end - pos))
        start = pos
        for i in range(0, len(got), 2):
            n, flags = got[i], got[i + 1]
            if n == 0:
                fail("zero-length extent at %d" % pos)
            n = min(n, end - pos)
            out.append((pos, n, flags))
            pos += n
            if pos >= end:
                break
        if pos == start:
            fail("no progress in block status at %d" % pos)
    return out

def run_extents():
    h = connect()
    if not h.can_meta_context(nbd.CONTEXT_BASE_ALLOCATION):
        fail("base:allocation not negotiated")
    # Make a few data areas: single bytes near edges and in the middle of
    # targets, and a larger run crossing several edges.
    E = edges()
    for e in E[1:-1:3]:
        do_write(h, e - 1, 2, 0, "extent seed")
    do_write(h, size // 3, 20000, 0, "extent seed")
    h.flush()
    windows = [(0, size)]
    for e in E:
        for d, n in ((-1, 2), (-512, 1024), (-4096, 8192), (-1, 3 * 4096 + 7)):
            windows.append(clip(e + d, n))
    for i in range(50):
        a = rng.randrange(size)
        windows.append(clip(a, rng.randrange(1, size)))
    nholes = ndata = 0
    for off, count in windows:
        if count == 0:
            continue
        got = block_status(h, off, count)
        # Soundness: a range reported as zero must read as zeroes.
        for d, n, flags in got:
            if flags & nbd.STATE_ZERO and h.pread(n, d) != bytes(n):
                fail("extent %d+%d has the zero flag but is not zero" % (d, n))
            if flags & nbd.STATE_HOLE and not flags & nbd.STATE_ZERO:
                fail("extent %d+%d is a hole but not zero (flags %d)" % (d, n, flags))
        # Precision: the hole bit matches the backing files' holes
        # remapped into device coordinates (and the zero target is a hole).
        want = list(expected_holes(off, count))
        def at(lst, x):
            for d, n, v in lst:
                if d <= x < d + n:
                    return v
            raise AssertionError(x)
        cuts = sorted(set([d for d, n, f in got] + [d for d, n, v in want] + [off + count]))
        for a, b in zip(cuts, cuts[1:]):
            hole_got = bool(at(got, a) & nbd.STATE_HOLE)
            hole_want = at(want, a)
            if hole_got != hole_want:
                fail("block status %d+%d: device bytes %d..%d reported %s, "
                     "backing says %s; server extents %r"
                     % (off, count, a, b, "hole" if hole_got else "data",
                        "hole" if hole_want else "data", got[:20]))
            if hole_got:
                nholes += 1
            else:
                ndata += 1
    if nholes == 0 or ndata == 0:
        fail("extents test saw no holes or no data (%d/%d)" % (nholes, ndata))
    # REQ_ONE: a single extent starting at the offset, whose type holds
    # over its whole length.
    for e in E[:-1]:
        for off in (e - 1, e, e + 1, e + 513):
            if off < 0 or off >= size:
                continue
            got = []
            def cb(metacontext, offset, entries, err):
                if metacontext == nbd.CONTEXT_BASE_ALLOCATION:
                    got.extend(entries)
            h.block_status(size - off, off, cb, nbd.CMD_FLAG_REQ_ONE)
            if len(got) != 2:
                fail("REQ_ONE at %d returned %d extents" % (off, len(got) // 2))
            n, flags = min(got[0], size - off), got[1]
            for d, k, v in expected_holes(off, n):
                if v != bool(flags & nbd.STATE_HOLE):
                    fail("REQ_ONE at %d: extent %d+%d flags %d, but device "
                         "bytes %d..%d are %s" % (off, off, n, flags, d, d + k,
                                                  "hole" if v else "data"))
    h.shutdown()

{"rw": run_rw, "extents": run_extents}[mode]()
print("rw_edges.py %s %s: ok" % (mode, os.path.basename(table)))
