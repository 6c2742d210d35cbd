#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# A discard must not let another volume reuse a data block while I/O
# to it is still in flight (dm's deferred set): the fast path of a
# thin volume sends reads and writes of mapped blocks to the data
# device with no lock, so a discard can unmap the block under them,
# and once that is committed the block goes to whoever asks next.
#
# 1. A write held in flight: the pool's data device is a remote NBD
#    server whose write zeroes wait 3 s (nbdkit's delay filter), and
#    its writes none.  Volume 1 zeroes its mapped block (held), discards
#    it and flushes; volume 2 then writes a block, which gets the freed
#    one.  When the held zeroing lands, volume 2's data must still be
#    there.
# 2. A read held in flight: the data device is a delay device whose
#    read delay a message sets to 3 s.  Volume 1 reads its block
#    (held), discards it and flushes; volume 2 writes the freed block.
#    The read must return volume 1's data, not volume 2's.
source "$(dirname "$0")/functions-ms.sh"
requires nbdsh --version
requires thin_check -V

md=$(mkfile md.img 4M)
data=$(mkfile data.img 128K)            # two 64 KiB blocks
md2=$(mkfile md2.img 4M)
start_server slow --filter=delay memory 128K delay-zero=3
mkdir -p "$tmpdir/tables"
start_server --stderr "$tmpdir/log" ctl -f mapper tables="$tmpdir/tables"
# 1: remote data, write zeroes delayed.
ms create rpool --table "0 256 thin-pool $md2 nbd+unix:///?socket=$tmpdir/slow.sock 128 0 1 no_discard_passdown"
ms message rpool 0 create_thin 1
ms message rpool 0 create_thin 2
ms create r1 --table "0 256 thin mapper:rpool 1"
ms create r2 --table "0 256 thin mapper:rpool 2"
# 2: a delay device.
ms create data --table "0 256 delay $data 0 0 $data 0 0 $data 0 0"
ms create pool --table "0 256 thin-pool $md mapper:data 128 0 1 no_discard_passdown"
ms message pool 0 create_thin 1
ms message pool 0 create_thin 2
ms create t1 --table "0 256 thin mapper:pool 1"
ms create t2 --table "0 256 thin mapper:pool 2"

cat > "$tmpdir/inflight.py" <<'EOF2'
import sys, time, subprocess, nbd
sock, ms, part = sys.argv[1], sys.argv[2], sys.argv[3]
B = 65536
def conn(name):
    h = nbd.NBD()
    h.connect_uri("nbd+unix:///%s?socket=%s" % (name, sock))
    return h
def delays(*ms_):
    subprocess.check_call([ms, "message", "data", "0", "delay"] +
                          [str(x) for x in ms_])
def wait(h, c):
    while not h.aio_command_completed(c):
        h.poll(100)
if part == "write":
    a1, a2, b = conn("r1"), conn("r1"), conn("r2")
    a1.pwrite(b"a" * 2 * B, 0)
    a1.flush()                          # the pool is full: 2/2 blocks
    ca = a1.aio_zero(B, 0)              # held 3 s by the data server
    time.sleep(0.3)
    assert not a1.aio_command_completed(ca)
    a2.trim(B, 0)                       # unmaps volume 1's block 0
    a2.flush()                          # commits: the block is free
    b.pwrite(b"B" * B, 0)               # provisions the freed block
    b.flush()
    wait(a1, ca)
    got = b.pread(B, 0)
    assert got == b"B" * B, \
        "volume 2's block holds %r...: a late write of volume 1 landed " \
        "in it" % got[:8]
    assert a2.pread(B, 0) == b"\0" * B
    print("write: volume 2 intact")
else:
    a1, a2, b = conn("t1"), conn("t1"), conn("t2")
    a1.pwrite(b"a" * 2 * B, 0)
    a1.flush()
    delays(3000, 0, 0)
    buf = nbd.Buffer(B)
    ca = a1.aio_pread(buf, B)           # held 3 s
    time.sleep(0.3)
    assert not a1.aio_command_completed(ca)
    a2.trim(B, B)
    a2.flush()
    b.pwrite(b"C" * B, B)               # provisions the freed block
    b.flush()
    wait(a1, ca)
    delays(0, 0, 0)
    got = bytes(buf.to_bytearray())
    assert got == b"a" * B, \
        "a read of volume 1 returned %r...: volume 2's data" % got[:8]
    assert b.pread(B, B) == b"C" * B
    print("read: volume 1's data")
EOF2
python3 "$tmpdir/inflight.py" "$sock" "$NBDMSETUP" write ||
    die "a late write landed in another volume's block"
python3 "$tmpdir/inflight.py" "$sock" "$NBDMSETUP" read ||
    die "a late read returned another volume's data"
ms status rpool
ms status pool
stop_server ctl
for m in "$md" "$md2"; do
    thin_check "$m" || die "thin_check $m"
    thin_dump "$m"
done
