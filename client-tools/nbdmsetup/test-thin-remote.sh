#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# A thin pool whose data device is a remote NBD server (nbdkit memory over
# a Unix socket), and a thin volume over a remote, read-only external
# origin (nbdkit -r file): reads of unwritten blocks come from the origin
# (zeros past its end), the first write to a block copies it into the
# pool, the origin is never written, the volume stays writable although
# its origin is not, and block status shows the origin's extents where
# the volume has written nothing.  thin_check is clean at the end.
source "$(dirname "$0")/functions-ms.sh"
requires nbdsh --version
requires nbdinfo --version
requires thin_check -V

md=$(mkfile md.img 4M)
golden=$(mkfile golden.img 3M)
fill_random "$golden" 2097152 5        # the last MiB stays a hole
cp "$golden" "$tmpdir/golden.orig"
start_server data memory 64M
start_server origin -r file "$golden"
mkdir "$tmpdir/tables"
start_server --stderr "$tmpdir/log" ctl -f mapper tables="$tmpdir/tables"
ms create pool --table "0 131072 thin-pool $md nbd+unix:///?socket=$tmpdir/data.sock 128 0"
ms message pool 0 create_thin 1
ms message pool 0 create_thin 2
# 4 MiB volume over a 3 MiB origin
ms create vm --table "0 8192 thin mapper:pool 1 nbd+unix:///?socket=$tmpdir/origin.sock"
ms create plain --table "0 8192 thin mapper:pool 2"
ms info vm | grep -q 'Read only' && die "vm is read-only"

nbdinfo --map "nbd+unix:///vm?socket=$sock" > "$tmpdir/map0"
cat "$tmpdir/map0"
grep -Eq '^ +0 +2097152 +0 +data$' "$tmpdir/map0" || die "map: origin data"
grep -Eq '^ +2097152 +2097152 +3 +hole,zero$' "$tmpdir/map0" ||
    die "map: origin hole and past its end"

nbdsh -u "nbd+unix:///vm?socket=$sock" -c '
golden = open("'"$tmpdir/golden.orig"'", "rb").read()
want = bytearray(golden + bytes((4 << 20) - len(golden)))
assert h.pread(4 << 20, 0) == want, "reads before any write"
# partial writes into origin blocks: the rest of each block is the origin
for off, n in [(100, 5000), (65536 * 3 + 7, 65536), ((3 << 20) - 100, 300)]:
    b = bytes([off % 251 + 1]) * n
    h.pwrite(b, off)
    want[off:off + n] = b
h.zero(4096, 1 << 20)
want[1 << 20:(1 << 20) + 4096] = bytes(4096)
h.flush()
assert h.pread(4 << 20, 0) == want, "reads after the writes"
open("'"$tmpdir/vm.want"'", "wb").write(want)
'
cmp "$golden" "$tmpdir/golden.orig" || die "the origin was written"
ms status vm | grep -q '^0 8192 thin 768 ' || die "vm maps $(ms status vm)"

# The plain volume's data is in the remote pool.
nbdsh -u "nbd+unix:///plain?socket=$sock" -c '
h.pwrite(b"\x5a" * 200000, 12345)
h.flush()
assert h.pread(200000, 12345) == b"\x5a" * 200000
'
# A restart: the metadata is local, the data still in nbdkit memory.
stop_server ctl
thin_check "$md" || die "thin_check"
start_server --stderr "$tmpdir/log2" ctl -f mapper tables="$tmpdir/tables"
nbdsh -u "nbd+unix:///vm?socket=$sock" -c '
assert h.pread(4 << 20, 0) == open("'"$tmpdir/vm.want"'", "rb").read()
'
nbdsh -u "nbd+unix:///plain?socket=$sock" -c '
assert h.pread(200000, 12345) == b"\x5a" * 200000
'
stop_server ctl
thin_check "$md" || die "thin_check after the restart"
echo "$0: ok"
