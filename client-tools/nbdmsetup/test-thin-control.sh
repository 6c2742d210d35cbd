#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Control commands on a thin pool that must wait for I/O held by its
# data device, a device below it ("data", suspended), must not wait
# holding the control export's lock: the resume of "data", which ends
# the wait, needs that lock.  While such a command waits, changes to the
# pool device are refused as busy (status 4), other commands run, and
# once data's resume lets the I/O go the command completes.
#  1. reserve_metadata_snap while a write provisioning a block is held
#     (it holds the pool's commit lock shared; the reserve takes it
#     exclusive and flushes the data device).
#  2. a message (create_thin) whose commit flushes the data device,
#     which has writes of the pool not yet flushed.
#  3. a resume that swaps in a loaded pool table, and 4. a replace of
#     it, while a provisioning write is held (the pool's postsuspend
#     waits for those).
#  5. a resume that swaps, whose flush of the pool device's backends
#     (the engine's, before the swap) reaches data's gate.
# Every metadata device passes thin_check afterwards.
source "$(dirname "$0")/functions-ms.sh"
requires nbdsh --version
requires thin_check -V
requires thin_dump -V
requires timeout --version

md=$(mkfile md.img 4M)
data=$(mkfile data.img 1M)              # 16 blocks of 64 KiB
mkdir -p "$tmpdir/tables"
start_server ctl mapper tables="$tmpdir/tables"
ms create data --table "0 2048 linear $data 0"
ptable="0 2048 thin-pool $md mapper:data 128 0"
ms create pool --table "$ptable"
ms message pool 0 create_thin 1
ms create t --table "0 2048 thin mapper:pool 1"

# held_write BLOCK: suspend data, then write BLOCK of t (unprovisioned)
# in the background: held at data's gate while provisioning.
cat > "$tmpdir/held.py" <<'EOF2'
import sys, nbd
sock, block, flag = sys.argv[1], int(sys.argv[2]), sys.argv[3]
B = 65536
h = nbd.NBD()
h.connect_uri("nbd+unix:///t?socket=%s" % sock)
c = h.aio_pwrite(nbd.Buffer.from_bytearray(bytearray(b"w" * B)), block * B)
for i in range(5):
    h.poll(100)
assert not h.aio_command_completed(c), "the write was not held"
open(flag, "w").write("held")
while not h.aio_command_completed(c):
    h.poll(1000)
assert h.pread(B, block * B) == b"w" * B
EOF2
held_write ()
{
    rm -f "$tmpdir/held"
    ms suspend data
    python3 "$tmpdir/held.py" "$sock" "$1" "$tmpdir/held" &
    writer=$!
    cleanup_fn "kill $writer 2>/dev/null"
    wait_for test -s "$tmpdir/held" || die "the write is not held"
}

# waits WHAT CMD...: CMD (in the background) waits for data's resume;
# meanwhile other commands run, changes to the pool are refused as busy,
# and data's resume ends it.  The timeouts only keep a hung server from
# hanging the test.
waits ()
{
    local what=$1 rc
    shift
    "$@" > "$tmpdir/cmd.out" 2>&1 &
    cmd=$!
    until_busy "$what" pool "busy\|waiting for" "$cmd" "$tmpdir/cmd.out"
    echo "$what: busy: $(cat "$tmpdir/busy")"
    # Busy is status 4 (PROTO_ERR_BUSY): nbdmsetup exits 1 and says so.
    rc=0
    timeout 10 "$NBDMSETUP" message pool 0 create_thin 99 2> "$tmpdir/busy" || rc=$?
    [ "$rc" -eq 1 ] && grep -q "busy\|waiting for" "$tmpdir/busy" ||
        die "$what: a message to the pool was not refused as busy ($rc): $(cat "$tmpdir/busy")"
    timeout 10 "$NBDMSETUP" info pool > /dev/null || die "$what: info pool blocked"
    timeout 10 "$NBDMSETUP" status pool > /dev/null || die "$what: status pool blocked"
    timeout 10 "$NBDMSETUP" ls > /dev/null || die "$what: ls blocked"
    timeout 10 "$NBDMSETUP" resume data || die "$what: resume data failed or blocked"
    wait "$cmd" || die "$what failed: $(cat "$tmpdir/cmd.out")"
    [ -z "$writer" ] || wait "$writer" || die "$what: the held write failed"
}

# part N: run part N (all unless THIN_CONTROL_PARTS lists some: a check
# of one part alone on broken code).
part () { [[ ${THIN_CONTROL_PARTS:-12345} == *$1* ]]; }
want=()

# 1.
if part 1; then
held_write 0
waits reserve_metadata_snap ms message pool 0 reserve_metadata_snap
ms status pool | grep -Eq ' [0-9]+ rw ' || die "no metadata snapshot held: $(ms status pool)"
ms message pool 0 release_metadata_snap
want+=("0 w")
fi

# 2. A write acknowledged, not flushed: data's suspend flushes its file,
# but the pool's flush of mapper:data still goes to data's gate.  To a
# mapped block, so that only the message's commit flushes it.
if part 2; then
nbdsh -u "nbd+unix:///t?socket=$sock" -c '
h.pwrite(b"v" * 65536, 65536)
h.flush()
h.pwrite(b"x" * 65536, 65536)           # mapped: the commit thread has
                                        # no reason to flush it'
ms suspend data
writer=
waits "create_thin (its commit)" ms message pool 0 create_thin 2
ms message pool 0 delete 2
want+=("1 x")
fi

# 3.
if part 3; then
ms load pool --table "$ptable"
held_write 2
waits "resume (swap)" ms resume pool
ms info pool | grep -q '^State:             ACTIVE$' || die "pool not active"
want+=("2 w")
fi

# 4.
if part 4; then
held_write 3
waits replace ms replace pool --table "$ptable"
want+=("3 w")
fi

# 5. A resume that swaps flushes the pool device's data device first
# (the engine's flush, not the pool's commit: a write to a mapped block
# changes no metadata), which data's gate holds.
if part 5; then
nbdsh -u "nbd+unix:///t?socket=$sock" -c '
h.pwrite(b"e" * 65536, 4 * 65536)
h.flush()
h.pwrite(b"f" * 65536, 4 * 65536)       # mapped: no metadata change'
ms load pool --table "$ptable"
ms suspend data
writer=
waits "resume (swap, its flush)" ms resume pool
want+=("4 f")
fi

for w in "${want[@]}"; do
    nbdsh -u "nbd+unix:///t?socket=$sock" -c "
B = 65536
assert h.pread(B, ${w% *} * B) == b'${w#* }' * B, 'block ${w% *}'
h.flush()"
done
ms status pool
stop_server ctl
thin_check "$md" || die "thin_check"
thin_dump "$md"
echo "$0: ok"
