#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Concurrent writes to the same unprovisioned (or shared) block provision
# it once (dm's bio prison): 16 writes in flight at a time, each to its
# own 4 KiB of one 64 KiB block, over 4 connections, for 48 blocks; then
# again on a snapshot's shared blocks (copy on write).  Every write is
# there, each volume maps exactly 48 blocks and the pool uses exactly the
# blocks the volumes need: none was allocated twice.  A suspended pool
# holds its volumes' writes, provisioning ones included.
source "$(dirname "$0")/functions-ms.sh"
requires nbdsh --version
requires thin_check -V

thin_pool 4M 16M 0
ms create t1 --table "0 8192 thin mapper:pool 1"

race="$tmpdir/race.py"
cat > "$race" <<'EOF2'
import sys, nbd
sock, name, tag = sys.argv[1], sys.argv[2], int(sys.argv[3])
hs = []
for i in range(4):
    h = nbd.NBD()
    h.connect_uri("nbd+unix:///%s?socket=%s" % (name, sock))
    hs.append(h)
for blk in range(48):
    cookies = []
    for piece in range(16):
        h = hs[piece % 4]
        buf = bytes([tag, blk, piece]) * (4096 // 3) + b"\0"
        cookies.append((h, h.aio_pwrite(buf, blk * 65536 + piece * 4096)))
    for h, c in cookies:
        while not h.aio_command_completed(c):
            h.poll(-1)
h = hs[0]
for blk in range(48):
    got = h.pread(65536, blk * 65536)
    for piece in range(16):
        want = bytes([tag, blk, piece]) * (4096 // 3) + b"\0"
        assert got[piece * 4096:(piece + 1) * 4096] == want, (blk, piece)
h.flush()
EOF2
python3 "$race" "$sock" t1 1 || die "concurrent provisioning"
[ "$(ms status t1)" = "0 8192 thin 6144 6143" ] || die "t1: $(ms status t1)"
ms status pool | grep -q ' 48/256 ' || die "pool: $(ms status pool)"

# The same on shared blocks: a snapshot, then racing writes to the origin.
ms suspend t1
ms message pool 0 create_snap 2 1
ms resume t1
ms create t2 --table "0 8192 thin mapper:pool 2"
python3 "$race" "$sock" t1 2 || die "concurrent copy on write"
ms status pool | grep -q ' 96/256 ' || die "pool after COW: $(ms status pool)"
python3 - "$sock" <<'EOF2' || die "the snapshot changed"
import sys, nbd
h = nbd.NBD()
h.connect_uri("nbd+unix:///t2?socket=%s" % sys.argv[1])
for blk in range(48):
    got = h.pread(65536, blk * 65536)
    for piece in range(16):
        assert got[piece * 4096:(piece + 1) * 4096] == \
            bytes([1, blk, piece]) * (4096 // 3) + b"\0", (blk, piece)
EOF2
# A suspended pool holds its volumes' writes, those that provision a
# block (which go to the data device directly) as well as the others;
# the resume lets them finish.
ms suspend pool
python3 - "$sock" "$tmpdir/held" <<'EOF2' &
import sys, nbd
h = nbd.NBD()
h.connect_uri("nbd+unix:///t1?socket=%s" % sys.argv[1])
new = h.aio_pwrite(b"n" * 4096, 60 * 65536)       # unprovisioned
old = h.aio_pwrite(b"o" * 4096, 0)                 # provisioned
for i in range(20):
    h.poll(50)
assert not h.aio_command_completed(new), "a provisioning write ran while the pool was suspended"
assert not h.aio_command_completed(old), "a write ran while the pool was suspended"
open(sys.argv[2], "w").write("1")
# (a completed command is retired by the call that says so: once each)
while h.aio_in_flight() > 0:
    h.poll(1000)
assert h.aio_command_completed(new) and h.aio_command_completed(old)
assert h.pread(4096, 60 * 65536) == b"n" * 4096
assert h.pread(4096, 0) == b"o" * 4096
EOF2
held=$!
wait_file "$tmpdir/held" || { kill $held; die "writes not held by the suspended pool"; }
ms resume pool
wait $held || die "held writes after the resume"

ms remove t2
ms remove t1
ms remove pool
stop_server ctl
thin_check "$md" || die "thin_check"
echo "$0: ok"
