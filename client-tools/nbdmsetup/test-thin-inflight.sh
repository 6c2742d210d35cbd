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
# 3. A message while the pool's commit would wait for I/O held by a
#    suspended device below (the pool's data device): a read held at its
#    gate after a discard (a drain), then a write to an unprovisioned
#    block (commit_rw held shared).  The message runs under the control
#    lock that the data device's resume needs: it must not wait for the
#    commit (the pool's commit thread does it once the I/O is done).
# 4. Each pool's periodic commit is its own (dm: a worker per pool): a
#    pool whose commit waits for a clone held below (a read of volume 1
#    held 8 s by the delay device, with a discard of volume 2's block to
#    drain before the pool may commit) must not hold up another pool's once-a-second
#    commit: pool B's write, never flushed, must be in B's committed
#    metadata (thin_dump of its metadata device) before the read is let
#    go.
# 5. A suspend of the pool waits for the writes it sent to the data
#    device directly (provisioning: dm's postsuspend flushes the pool's
#    worker): a write to a new block held 2 s by the delay device must
#    be in the data file once the suspend returns.
source "$(dirname "$0")/functions-ms.sh"
requires nbdsh --version
requires thin_check -V
requires thin_dump -V

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
# 4: pool B, on a file.
mdb=$(mkfile mdb.img 4M)
datab=$(mkfile datab.img 128K)
ms create bpool --table "0 256 thin-pool $mdb $datab 128 0"
ms message bpool 0 create_thin 1
ms create tb --table "0 256 thin mapper:bpool 1"

cat > "$tmpdir/inflight.py" <<'EOF2'
import sys, time, subprocess, nbd
sock, ms, part, mdb = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
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
elif part == "read":
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
elif part == "pools":
    def mapped_in_b():
        xml = subprocess.check_output(["thin_dump", mdb]).decode()
        return 'origin_begin="0"' in xml or 'origin_block="0"' in xml
    a1, a2, b = conn("t1"), conn("t2"), conn("tb")
    delays(8000, 0, 0)
    buf = nbd.Buffer(B)
    ca = a1.aio_pread(buf, 0)           # held 8 s below the pool
    time.sleep(0.3)
    assert not a1.aio_command_completed(ca)
    a2.trim(B, B)                       # unmaps volume 2's block: the
                                        # next commit must drain first
    time.sleep(1.5)                     # its periodic commit is waiting
    assert not mapped_in_b()
    b.pwrite(b"b" * B, 0)               # pool B changes; nobody flushes
    # B's commit must come before the read is let go (8 s: B's period
    # is 1).
    while not mapped_in_b():
        assert not a1.aio_command_completed(ca), \
            "pool B's write was not committed while pool A's read was " \
            "held: B's periodic commit waited for A's drain"
        a1.poll(200)                    # a1's reply, if it comes
    print("pools: pool B committed while pool A drains")
    wait(a1, ca)
    delays(0, 0, 0)
    assert bytes(buf.to_bytearray()) == b"a" * B
elif part == "suspend":
    a1 = conn("t1")
    a1.flush()                          # t1's block 1 is free again
    delays(0, 2000, 0)
    cw = a1.aio_pwrite(nbd.Buffer.from_bytearray(bytearray(b"p" * B)), B)
    time.sleep(0.3)                     # provisioning, held 2 s
    assert not a1.aio_command_completed(cw)
    subprocess.check_call([ms, "suspend", "pool"])
    with open(sys.argv[5], "rb") as f:
        landed = b"p" * B in f.read()
    subprocess.check_call([ms, "resume", "pool"])
    wait(a1, cw)
    delays(0, 0, 0)
    assert landed, "the pool's suspend returned before its write to " \
        "the data device landed"
    assert a1.pread(B, B) == b"p" * B
    print("suspend: the write landed first")
EOF2
python3 "$tmpdir/inflight.py" "$sock" "$NBDMSETUP" write "$mdb" ||
    die "a late write landed in another volume's block"
python3 "$tmpdir/inflight.py" "$sock" "$NBDMSETUP" read "$mdb" ||
    die "a late read returned another volume's data"
python3 "$tmpdir/inflight.py" "$sock" "$NBDMSETUP" pools "$mdb" ||
    die "one pool's drain held up another pool's periodic commit"
python3 "$tmpdir/inflight.py" "$sock" "$NBDMSETUP" suspend "$mdb" "$data" ||
    die "a suspend of the pool did not wait for its writes in flight"

# 3: messages while I/O is held by the suspended data device.  The
# timeouts only keep a hung server from hanging the test.
md3=$(mkfile md3.img 4M)
data3=$(mkfile data3.img 256K)
ms create data3 --table "0 512 linear $data3 0"
ms create pool3 --table "0 512 thin-pool $md3 mapper:data3 128 0 1 no_discard_passdown"
ms message pool3 0 create_thin 1
ms create t3 --table "0 512 thin mapper:pool3 1"
nbdsh -u "nbd+unix:///t3?socket=$sock" -c 'h.pwrite(b"c" * 131072, 0); h.flush()'
cat > "$tmpdir/held.py" <<'EOF2'
import sys, os, nbd
sock, ms, what = sys.argv[1], sys.argv[2], sys.argv[3]
B = 65536
h, h2 = nbd.NBD(), nbd.NBD()
for x in (h, h2):
    x.connect_uri("nbd+unix:///t3?socket=%s" % sock)
buf = nbd.Buffer(B)
if what == "read":
    c = h.aio_pread(buf, 0)             # held at data3's gate
    h2.trim(B, B)                       # the next commit drains first
else:
    c = h.aio_pwrite(nbd.Buffer.from_bytearray(bytearray(b"w" * B)),
                     2 * B)             # provisions: commit_rw shared
for i in range(5):
    h.poll(100)
assert not h.aio_command_completed(c), "the %s was not held" % what
open(sys.argv[4], "w").write("held")
while not h.aio_command_completed(c):
    h.poll(1000)
if what == "read":
    assert bytes(buf.to_bytearray()) == b"c" * B
h.flush()
EOF2
n=2
for what in read write; do
    rm -f "$tmpdir/held"
    ms suspend data3
    python3 "$tmpdir/held.py" "$sock" "$NBDMSETUP" $what "$tmpdir/held" &
    held=$!
    wait_for test -s "$tmpdir/held"
    timeout 20 "$NBDMSETUP" message pool3 0 create_thin $n ||
        die "a message waited for I/O held by the suspended data device (a $what)"
    timeout 20 "$NBDMSETUP" resume data3 ||
        die "resume data3 failed after the message (a $what held)"
    wait $held || die "the held $what failed"
    n=$((n + 1))
done
ms status pool3
ms remove t3
ms message pool3 0 delete 1
ms status rpool
ms status pool
ms status bpool
stop_server ctl
for m in "$md" "$md2" "$md3" "$mdb"; do
    thin_check "$m" || die "thin_check $m"
    thin_dump "$m"
done
