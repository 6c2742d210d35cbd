#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Each pool's periodic commit is its own (dm: a worker per pool): a pool
# whose commit waits for a clone held below (here a read held 8 s by a
# delay device under pool A, with a discard of A to drain before A may
# commit) must not hold up another pool's once-a-second commit.  Pool
# B's write, never flushed, must be in B's committed metadata (thin_dump
# of its metadata device) before A's read is let go.
source "$(dirname "$0")/functions-ms.sh"
requires nbdsh --version
requires thin_check -V
requires thin_dump -V

mda=$(mkfile mda.img 4M)
dataa=$(mkfile dataa.img 128K)          # two 64 KiB blocks
mdb=$(mkfile mdb.img 4M)
datab=$(mkfile datab.img 128K)
mkdir -p "$tmpdir/tables"
start_server --stderr "$tmpdir/log" ctl -f mapper tables="$tmpdir/tables"
ms create adata --table "0 256 delay $dataa 0 0 $dataa 0 0 $dataa 0 0"
ms create apool --table "0 256 thin-pool $mda mapper:adata 128 0 1 no_discard_passdown"
ms message apool 0 create_thin 1
ms create ta --table "0 256 thin mapper:apool 1"
ms create bpool --table "0 256 thin-pool $mdb $datab 128 0"
ms message bpool 0 create_thin 1
ms create tb --table "0 256 thin mapper:bpool 1"

cat > "$tmpdir/pools.py" <<'EOF2'
import sys, time, subprocess, nbd
sock, ms, mdb = sys.argv[1], sys.argv[2], sys.argv[3]
B = 65536
def conn(name):
    h = nbd.NBD()
    h.connect_uri("nbd+unix:///%s?socket=%s" % (name, sock))
    return h
def delays(*ms_):
    subprocess.check_call([ms, "message", "adata", "0", "delay"] +
                          [str(x) for x in ms_])
def mapped_in_b():
    xml = subprocess.check_output(["thin_dump", mdb]).decode()
    return 'origin_begin="0"' in xml or 'origin_block="0"' in xml
a1, a2, b = conn("ta"), conn("ta"), conn("tb")
a1.pwrite(b"a" * 2 * B, 0)
a1.flush()
delays(8000, 0, 0)
buf = nbd.Buffer(B)
ca = a1.aio_pread(buf, 0)               # held 8 s below pool A
time.sleep(0.3)
assert not a1.aio_command_completed(ca)
a2.trim(B, B)                           # A's next commit must drain first
time.sleep(1.5)                         # A's periodic commit is waiting
assert not mapped_in_b()
b.pwrite(b"b" * B, 0)                   # pool B changes; nobody flushes
# B's commit must come before A's read is let go (8 s: B's period is 1).
while not mapped_in_b():
    assert not a1.aio_command_completed(ca), \
        "pool B's write was not committed while pool A's read was held: " \
        "B's periodic commit waited for A's drain"
    a1.poll(200)                        # a1's reply, if it comes
print("pool B committed while pool A drains")
while not a1.aio_command_completed(ca):
    a1.poll(100)
delays(0, 0, 0)
assert bytes(buf.to_bytearray()) == b"a" * B
EOF2
python3 "$tmpdir/pools.py" "$sock" "$NBDMSETUP" "$mdb" ||
    die "one pool's drain held up another pool's periodic commit"
ms status apool
ms status bpool
stop_server ctl
for m in "$mda" "$mdb"; do
    thin_check "$m" || die "thin_check $m"
done
