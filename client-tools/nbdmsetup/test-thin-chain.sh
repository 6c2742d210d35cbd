#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Snapshots of snapshots ten deep through the server (issue 14: reference
# counts right through the chain): volume 1 writes 16 blocks; volume L
# (2 to 11) is a snapshot of volume L-1 (taken with it suspended, as
# dm asks) and then overwrites its block L; volume 1 then overwrites its
# block 15.  Every volume reads exactly its model, the pool uses exactly
# 16 + 10 + 1 blocks, deleting volumes from the middle frees nothing that
# a later one still shares and deleting the end frees its own block;
# thin_check is clean, thin_dump counts 16 mappings per volume, and
# thin_delta shows exactly the blocks that differ between two volumes.
source "$(dirname "$0")/functions-ms.sh"
requires nbdsh --version
requires thin_check -V
requires thin_dump -V
requires thin_delta -V

thin_pool 4M 8M 0                       # 128 blocks of 64 KiB
ms create t1 --table "0 2048 thin mapper:pool 1"        # 16 blocks

# Block b of a write by volume L holds bytes L, b, L, b...
pat () { echo "bytes([$1, $2]) * 32768"; }
nbdsh -u "nbd+unix:///t1?socket=$sock" -c "
for b in range(16):
    h.pwrite($(pat 1 b), b << 16)
h.flush()
"
for (( l = 2; l <= 11; l++ )); do
    ms suspend "t$((l - 1))"
    ms message pool 0 create_snap $l $((l - 1))
    ms resume "t$((l - 1))"
    ms create "t$l" --table "0 2048 thin mapper:pool $l"
    nbdsh -u "nbd+unix:///t$l?socket=$sock" -c "h.pwrite($(pat $l $l), $l << 16); h.flush()"
done
nbdsh -u "nbd+unix:///t1?socket=$sock" -c "h.pwrite($(pat 1 99), 15 << 16); h.flush()"

used () { ms status pool | awk '{ split($6, d, "/"); print d[1] }'; }

# check VOL...: each volume reads as its model: block b is volume 1's
# (b, or 99 for block 15 of volume 1 itself), or the one written by the
# latest level L <= VOL with L == b.
check ()
{
    local v
    for v in "$@"; do
        nbdsh -u "nbd+unix:///t$v?socket=$sock" -c "
v = $v
for b in range(16):
    if v == 1 and b == 15:
        want = bytes([1, 99]) * 32768
    elif 2 <= b <= v:
        want = bytes([b, b]) * 32768
    else:
        want = bytes([1, b]) * 32768
    got = h.pread(65536, b << 16)
    assert got == want, 'volume %d block %d: %r, want %r' % (v, b, got[:2], want[:2])
" || die "volume $v does not read as its model"
    done
}
check 1 2 3 4 5 6 7 8 9 10 11
[ "$(used)" = 27 ] || die "data blocks used: $(used), expected 27 (16 + 10 + 1)"

# The middle goes: nothing freed (their blocks are shared down the chain).
for v in 5 6; do
    ms remove "t$v"
    ms message pool 0 delete $v
done
check 1 2 3 4 7 8 9 10 11
[ "$(used)" = 27 ] || die "data blocks used after deleting 5 and 6: $(used)"
# The end goes: its own block is freed (once committed).
ms remove t11
ms message pool 0 delete 11
check 1 2 3 4 7 8 9 10
[ "$(used)" = 26 ] || die "data blocks used after deleting 11: $(used)"

for v in 1 2 3 4 7 8 9 10; do ms remove "t$v"; done
ms remove pool
stop_server ctl
thin_check "$md" || die "thin_check"
thin_dump "$md" > "$tmpdir/dump.xml" || die "thin_dump"
python3 - "$tmpdir/dump.xml" <<'EOF2' || die "thin_dump: $(cat "$tmpdir/dump.xml")"
import re, sys
devs = re.findall(r'<device dev_id="(\d+)" mapped_blocks="(\d+)"', open(sys.argv[1]).read())
assert sorted(int(d) for d, n in devs) == [1, 2, 3, 4, 7, 8, 9, 10], devs
assert all(n == "16" for d, n in devs), devs
EOF2

# delta LEFT RIGHT BLOCKS: thin_delta shows exactly BLOCKS (a Python
# set) differing between the two volumes, every other block the same.
delta ()
{
    thin_delta --snap1 "$1" --snap2 "$2" "$md" > "$tmpdir/delta.xml" ||
        die "thin_delta $1 $2"
    python3 - "$tmpdir/delta.xml" "$3" <<'EOF2' || { cat "$tmpdir/delta.xml"; die "thin_delta $1 $2"; }
import re, sys
kinds = {}
for k, b, n in re.findall(r'<(same|different|left_only|right_only) begin="(\d+)" length="(\d+)"',
                          open(sys.argv[1]).read()):
    kinds.setdefault(k, set()).update(range(int(b), int(b) + int(n)))
want = eval(sys.argv[2])
assert kinds.get("different", set()) == want, kinds
assert not kinds.get("left_only") and not kinds.get("right_only"), kinds
assert kinds.get("same", set()) == set(range(16)) - want, kinds
EOF2
}
delta 7 10 '{8, 9, 10}'
delta 1 2 '{2, 15}'
delta 4 7 '{5, 6, 7}'
echo "$0: ok"
