#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Block status over striped devices: nbdinfo --map and qemu-img map give
# exactly the map built from the backing files themselves (SEEK_DATA /
# SEEK_HOLE on each stripe's area, chunk by chunk, in device order), on a
# 3 TiB sparse device with data at chunk, row and 4 GiB edges, on one
# with odd chunks and stripe offsets, and over remote stripes that answer
# at most 40 KiB per query (nbdkit's blocksize filter).  One block status
# request over a mostly sparse device is answered whole, not in pieces of
# MAX_EXTENTS chunks.
source "${top_srcdir:-$(dirname "$0")/..}/tests/functions.sh"

requires nbdkit --version
requires nbdinfo --version
requires qemu-img --version
requires python3 -c 'import nbd'

# put FILE OFFSET LEN SEED: LEN pseudo-random bytes at OFFSET of FILE.
put ()
{
    fill_random "$tmpdir/piece" "$3" "$4"
    python3 - "$1" "$2" "$tmpdir/piece" <<'EOF'
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY)
os.pwrite(fd, open(sys.argv[3], "rb").read(), int(sys.argv[2]))
os.close(fd)
EOF
}

# reference TABLE: the map of a one-target striped table, from its files:
# "offset length type" lines, adjacent extents of one type merged.

# check_map TABLE [URI-TABLE]: nbdinfo --map and qemu-img map of the
# device of URI-TABLE (default TABLE) are the reference of TABLE.
check_map ()
{
    local table=$1 served=${2:-$1} want got
    want=$(python3 "$top_srcdir/tests/striped_reference.py" "$table")
    got=$(mapper -U - "$served" --run 'nbdinfo --map "$uri"' |
              awk '{ print $1, $2, $3 }')
    [ "$got" = "$want" ] || {
        diff <(echo "$want") <(echo "$got") | head -20
        die "$served: nbdinfo --map differs from the files' map (< want, > got)"
    }
    mapper -U - "$served" \
           --run "qemu-img map -f raw --output=json \"\$uri\" > '$tmpdir/map.json'" ||
        die "$served: qemu-img map failed"
    got=$(python3 - "$tmpdir/map.json" <<'EOF'
import json, sys
for e in json.load(open(sys.argv[1])):
    print(e["start"], e["length"], 0 if e["data"] else 3)
EOF
)
    [ "$got" = "$want" ] || {
        diff <(echo "$want") <(echo "$got") | head -20
        die "$served: qemu-img map differs from the files' map (< want, > got)"
    }
}

# --- 3 TiB over three sparse 1 TiB files, 64K chunks ------------------------
T=$((1 << 40)) G=$((1 << 30)) K=1024
for i in 0 1 2; do mkfile big$i.img 1T >/dev/null; done
put "$tmpdir/big0.img" $((640 * K)) $((192 * K)) 1     # stripe 0, chunks 10-12
put "$tmpdir/big1.img" $((1000 * K)) $((3 * K)) 2      # inside a chunk
put "$tmpdir/big0.img" $((4 * G - 2 * K)) $((8 * K)) 3 # across 4 GiB of the file
put "$tmpdir/big1.img" $((12 * G + 60 * K)) $((8 * K)) 4   # across a chunk edge
put "$tmpdir/big2.img" $((T - 4 * K)) $((4 * K)) 5     # the device's last bytes
put "$tmpdir/big0.img" $((100 * G)) $((64 * K)) 6      # a row of three chunks
put "$tmpdir/big1.img" $((100 * G)) $((64 * K)) 7
put "$tmpdir/big2.img" $((100 * G)) $((64 * K)) 8
echo "0 $((3 * T / 512)) striped 3 128 $tmpdir/big0.img 0 $tmpdir/big1.img 0 $tmpdir/big2.img 0" \
     > "$tmpdir/big.table"

# First, one request of (almost) 4 GiB over the sparse start of the
# device: one reply for all of it (a few extents), not 256 MiB (4096
# chunks) of it (which also made the maps below take minutes).
cat > "$tmpdir/one.py" <<'EOF'
import sys
import nbd
h = nbd.NBD()
h.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
h.connect_uri(sys.argv[1])
count = (1 << 32) - (1 << 16)
got = []
def f(ctx, off, entries, err):
    if ctx == nbd.CONTEXT_BASE_ALLOCATION:
        got.extend(entries)
    return 0
h.block_status(count, 0, f)
covered = sum(got[0::2])
assert covered == count, "one reply covered %d of %d bytes (%d extents)" % (
    covered, count, len(got) // 2)
print("one.py: %d extents cover the request" % (len(got) // 2))
h.shutdown()
EOF
mapper -U - "$tmpdir/big.table" --run "python3 '$tmpdir/one.py' \"\$uri\"" ||
    die "a striped block status reply did not cover its request"

check_map "$tmpdir/big.table"

# --- odd chunks (7 sectors), stripes at odd offsets, data everywhere -------
for i in 0 1 2; do mkfile odd$i.img 4M >/dev/null; done
rows=1000 chunk=$((7 * 512))
seed=10
for i in 0 1 2; do
    for off in 0 5000 9000 20000 65536 300000 1000000 2000000 3500000; do
        seed=$((seed + 1))
        put "$tmpdir/odd$i.img" $((off + i * 1111)) $((1 + (seed * 2917) % 20000)) $seed
    done
done
put "$tmpdir/odd1.img" 0 $((4 << 20)) 99                   # stripe 1: all data
echo "0 $((3 * rows * 7)) striped 3 7 $tmpdir/odd0.img 5 $tmpdir/odd1.img 0 $tmpdir/odd2.img 13" \
     > "$tmpdir/odd.table"
check_map "$tmpdir/odd.table"

# --- the same through remote stripes answering at most 40 KiB each --------
if nbdkit --filter=blocksize null --version >/dev/null 2>&1; then
    for i in 0 1 2; do
        start_server r$i --filter=blocksize file "$tmpdir/odd$i.img" maxlen=40960
    done
    echo "0 $((3 * rows * 7)) striped 3 7 nbd+unix:///?socket=$tmpdir/r0.sock 5 nbd+unix:///?socket=$tmpdir/r1.sock 0 nbd+unix:///?socket=$tmpdir/r2.sock 13" \
         > "$tmpdir/remote.table"
    check_map "$tmpdir/odd.table" "$tmpdir/remote.table"
else
    echo "$0: remote part skipped: no nbdkit blocksize filter"
fi

echo "$0: ok"
