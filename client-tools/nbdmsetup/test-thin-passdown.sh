#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# A discard's passdown must not destroy the data of the volume its block
# goes to next.  dm-thin sends the passdown only once no I/O to the
# block is in flight (all_io_ds); here a freed block is handed out only
# after a commit, and the discard holds the pool's commit lock shared
# until its passdown is done, so a commit (and the reuse) waits for it.
#
# The data device is a remote NBD server whose reads wait 2 s and trims
# 4 s (nbdkit's delay filter), writes none.  Volume 1 fills the pool (2
# blocks), reads its block 1 (held), discards it (the passdown held);
# volume 2 then writes a block, which can only get block 1 once it is
# freed (a commit: it drains the held read first).  When everything has
# landed, volume 2's block must hold its data, not the zeros of a late
# passdown; volume 1's read returns its data or zeros (the discard
# raced it), never volume 2's.
source "$(dirname "$0")/functions-ms.sh"
requires nbdsh --version
requires thin_check -V
requires thin_dump -V

md=$(mkfile md.img 4M)
start_server slow --filter=delay memory 128K delay-read=2 delay-trim=4
mkdir -p "$tmpdir/tables"
start_server ctl mapper tables="$tmpdir/tables"
ms create pool --table "0 256 thin-pool $md nbd+unix:///?socket=$tmpdir/slow.sock 128 0"
ms status pool | grep -q ' discard_passdown ' || die "no passdown: $(ms status pool)"
ms message pool 0 create_thin 1
ms message pool 0 create_thin 2
ms create t1 --table "0 256 thin mapper:pool 1"
ms create t2 --table "0 256 thin mapper:pool 2"

cat > "$tmpdir/passdown.py" <<'EOF2'
import sys, time, nbd
sock = sys.argv[1]
B = 65536
def conn(name):
    h = nbd.NBD()
    h.connect_uri("nbd+unix:///%s?socket=%s" % (name, sock))
    return h
r1, d1, w2 = conn("t1"), conn("t1"), conn("t2")
r1.pwrite(b"a" * 2 * B, 0)
r1.flush()                              # the pool is full: 2/2 blocks
buf = nbd.Buffer(B)
cr = r1.aio_pread(buf, B)               # held 2 s by the data server
time.sleep(0.3)
assert not r1.aio_command_completed(cr)
cd = d1.aio_trim(B, B)                  # unmaps it; its passdown: 4 s
time.sleep(0.3)
cw = w2.aio_pwrite(nbd.Buffer.from_bytearray(bytearray(b"C" * B)), 0)
for h, c in ((r1, cr), (d1, cd), (w2, cw)):
    while not h.aio_command_completed(c):
        h.poll(100)
w2.flush()
read = bytes(buf.to_bytearray())
assert read in (b"a" * B, b"\0" * B), \
    "a read of volume 1 returned %r...: volume 2's data" % read[:8]
got = w2.pread(B, 0)
assert got == b"C" * B, \
    "volume 2's block holds %r...: a late passdown trimmed it" % got[:8]
assert d1.pread(B, B) == b"\0" * B
assert d1.pread(B, 0) == b"a" * B
print("volume 2 intact; volume 1's read: %r" % read[:1])
EOF2
python3 "$tmpdir/passdown.py" "$sock" ||
    die "a discard's passdown destroyed another volume's data"
ms status pool
stop_server ctl
thin_check "$md" || die "thin_check"
thin_dump "$md"
echo "$0: ok"
