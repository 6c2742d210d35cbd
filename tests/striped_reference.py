# SPDX-License-Identifier: BSD-3-Clause
"""The map of a one-target striped table from its backing files: "offset
length type" lines, adjacent extents of one type merged
(tests/test-striped-extents.sh compares nbdinfo --map with it).

  python3 striped_reference.py TABLE
"""
import os, sys
words = open(sys.argv[1]).read().split()
assert words[2] == "striped", words
length = int(words[1]) * 512
n, chunk = int(words[3]), int(words[4]) * 512
stripes = [(words[5 + 2 * i], int(words[6 + 2 * i]) * 512) for i in range(n)]
area = length // n
pieces = []                       # (device offset, length): data
for s, (path, start) in enumerate(stripes):
    fd = os.open(path, os.O_RDONLY)
    pos, end = start, start + area
    while pos < end:
        try:
            data = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError:
            break                 # ENXIO: holes to the end of the file
        if data >= end:
            break
        hole = min(os.lseek(fd, data, os.SEEK_HOLE), end)
        # Stripe bytes [data, hole) -> device, chunk by chunk.
        q = data - start
        while q < hole - start:
            row, inc = divmod(q, chunk)
            k = min(chunk - inc, hole - start - q)
            pieces.append(((row * n + s) * chunk + inc, k))
            q += k
        pos = hole
    os.close(fd)
pieces.sort()
out, at = [], 0
def add(off, ln, ty):
    if out and out[-1][2] == ty and out[-1][0] + out[-1][1] == off:
        out[-1][1] += ln
    else:
        out.append([off, ln, ty])
for off, ln in pieces:
    if off > at:
        add(at, off - at, 3)
    add(off, ln, 0)
    at = off + ln
if at < length:
    add(at, length - at, 3)
for off, ln, ty in out:
    print(off, ln, ty)
