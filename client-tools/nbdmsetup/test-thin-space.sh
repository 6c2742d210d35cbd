#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# A thin pool running out of data space, as dm's: the low water mark
# raises an event (nbdmsetup wait returns, logged); with
# error_if_no_space a write that needs a block fails with ENOSPC and the
# status says out_of_data_space; without it the write is queued, and a
# reload of the pool over a larger data device grows the pool and lets
# it finish.  Writes to provisioned blocks go on meanwhile, so do writes
# to other blocks that need no space, and a write waiting for space does
# not hold up a stop.
source "$(dirname "$0")/functions-ms.sh"
requires nbdsh --version
requires thin_check -V

st () { ms status pool | cut -d' ' -f6-; }

thin_pool 4M 2M 8 error_if_no_space      # 32 blocks of 64 KiB
ms create t1 --table "0 65536 thin mapper:pool 1"
uri="nbd+unix:///t1?socket=$sock"

# 1. The low water mark: 8 free blocks left after 24 are used.
e=$(ev pool)
nbdsh -u "$uri" -c 'h.pwrite(b"\1" * (23 << 16), 0)'
[ "$(ev pool)" = "$e" ] || die "event before the low water mark"
ms --json wait pool "$e" --timeout 30 > "$tmpdir/wait" &
waiter=$!
nbdsh -u "$uri" -c 'h.pwrite(b"\2" * 65536, 23 << 16)'
wait $waiter || die "no event at the low water mark (now $(ev pool))"
grep -E 'thin-pool: device pool: reached low water mark for data device \(8 free blocks, mark 8\)' \
     "$tmpdir/log" || { cat "$tmpdir/log"; die "low water mark not logged"; }
st | grep -q '^24/32 - rw ' || die "status: $(st)"

# 2. error_if_no_space: the 33rd block fails with ENOSPC; the rest works.
nbdsh -u "$uri" -c '
import errno
h.pwrite(b"\3" * (8 << 16), 24 << 16)
try:
    h.pwrite(b"\4", 40 << 16)
    assert False, "a write past the end of the data space worked"
except nbd.Error as e:
    assert e.errnum == errno.ENOSPC, e
h.pwrite(b"\5" * 4096, 0)           # provisioned: fine
assert h.pread(4096, 0) == b"\5" * 4096
assert h.pread(1, 40 << 16) == b"\0"
'
st | grep -q '^32/32 - out_of_data_space discard_passdown error_if_no_space ' ||
    die "status: $(st)"
grep -q 'switching pool to out-of-data-space mode' "$tmpdir/log" ||
    die "mode change not logged"

# 3. queue_if_no_space: the write waits until the pool grows.
ms reload pool --table "0 4096 thin-pool $md $data 128 8"
ms resume pool
nbdsh -u "$uri" -c '
import time
c = h.aio_pwrite(b"\6" * 65536, 41 << 16)
# queued, not failed: the status says so and the write is still there
for i in range(20):
    h.poll(50)
assert not h.aio_command_completed(c), "the queued write completed"
# The queued write holds no lock of its block meanwhile (one of 256,
# by hash): write zeroes to every other unprovisioned block (they stay
# unprovisioned, but take their block'"'"'s lock) all finish meanwhile.
for b in range(32, 512):
    if b != 41:
        h.zero(65536, b << 16)
assert not h.aio_command_completed(c), "the queued write completed"
with open("'"$tmpdir/queued"'", "w") as f: f.write("1")
while not h.aio_command_completed(c):
    h.poll(1000)
assert h.pread(65536, 41 << 16) == b"\6" * 65536
' &
writer=$!
wait_file "$tmpdir/queued"
st | grep -q '^32/32 - out_of_data_space discard_passdown queue_if_no_space ' ||
    die "status while queued: $(st)"
truncate -s 4M "$data"
ms reload pool --table "0 8192 thin-pool $md $data 128 8"
ms resume pool
wait $writer || die "the queued write did not finish after the pool grew"
st | grep -q '^33/64 - rw ' || die "status after growing: $(st)"
nbdsh -u "$uri" -c 'assert h.pread(65536, 0)[:4096] == b"\5" * 4096'

# 4. A write queued for space does not hold a stop up: SIGTERM gives it
# up (stop_server fails the test if the server is still there after
# 10 s, well before the 60 s a queued write may wait).
nbdsh -u "$uri" -c '
import errno
h.pwrite(b"\7" * (31 << 16), 42 << 16)          # the last 31 blocks
c = h.aio_pwrite(b"\10" * 65536, 80 << 16)
for i in range(20):
    h.poll(50)
assert not h.aio_command_completed(c), "the queued write completed"
with open("'"$tmpdir/queued2"'", "w") as f: f.write("1")
try:
    while not h.aio_command_completed(c):
        h.poll(1000)
    assert False, "the queued write worked with no space"
except nbd.Error as e:
    print("queued write given up:", e)
' > "$tmpdir/writer2" 2>&1 &
writer=$!
wait_file "$tmpdir/queued2"
st | grep -q '^64/64 - out_of_data_space ' || die "status while queued: $(st)"
stop_server ctl || die "the server did not stop with a write queued for space"
wait $writer || { cat "$tmpdir/writer2"; die "the queued write"; }
thin_check "$md" || die "thin_check"

# 5. The metadata low water mark (a quarter of the metadata device, at
# most 4 MiB): metadata from thin_restore that fills most of 5 MiB (150,000
# mappings) raises it when the pool loads.
python3 - > "$tmpdir/big.xml" <<'EOF2'
print('<superblock uuid="" time="0" transaction="1" flags="0" version="2" '
      'data_block_size="128" nr_data_blocks="300000">')
print('<device dev_id="1" mapped_blocks="150000" transaction="0" '
      'creation_time="0" snap_time="0">')
for s in range(0, 150000, 1000):
    print('<range_mapping origin_begin="%d" data_begin="%d" length="1000" '
          'time="0"/>' % (s, s))
print('</device></superblock>')
EOF2
md2=$(mkfile md2.img 5M)
thin_restore -i "$tmpdir/big.xml" -o "$md2" > /dev/null || die "thin_restore"
truncate -s 19200M "$tmpdir/data2.img"
start_server --stderr "$tmpdir/log3" ctl -f mapper tables="$tmpdir/tables"
ms create pool2 --table "0 39321600 thin-pool $md2 $tmpdir/data2.img 128 0"
ms status pool2
read -r used total thr < <(ms status pool2 | awk '{ split($5, m, "/"); print m[1], m[2], $NF }')
[ $((total - used)) -le "$thr" ] || die "the test's metadata is not past the mark: $(ms status pool2)"
grep -q 'thin-pool: device pool2: reached low water mark for metadata device' "$tmpdir/log3" ||
    { cat "$tmpdir/log3"; die "metadata low water mark not raised"; }
ms remove pool2
stop_server ctl
echo "$0: ok"
