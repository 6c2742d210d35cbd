#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# ext4 on a thin volume (nbdfuse + a loop device), larger than the pool's
# data device; a snapshot taken under load (writers running; the
# filesystem frozen across suspend + create_snap + resume, as LVM's
# suspend freezes it); the snapshot copied with nbdcopy and qemu-img
# convert stays sparse (its holes are extents), is fsck-clean and holds
# exactly the files of the moment it was taken; the origin is fsck-clean
# after more writes; thin_check is clean and thin_delta shows the
# snapshot and its origin differing.
source "$(dirname "$0")/functions-ms.sh"
requires nbdcopy --version
requires qemu-img --version
requires fsfreeze --version
requires thin_check -V
requires thin_delta -V
ext4_fuse_preflight

mkdir "$tmpdir/fuse" "$tmpdir/mnt" "$tmpdir/snap"
thin_pool 16M 512M 64
ms create t1 --table "0 1048576 thin mapper:pool 1"     # 512 MiB
cleanup_fn fuse_detach
# Only this test's own loop device (others may be in use on the machine).
cleanup_fn 'umount "$tmpdir/snap" 2>/dev/null; [ ! -s "$tmpdir/snaploop" ] || losetup -d "$(cat "$tmpdir/snaploop")" 2>/dev/null || :'

fuse_attach "nbd+unix:///t1?socket=$sock" || die "nbdfuse did not come up"
ext4_fill 16
ext4_writers 20                 # until told to stop
sleep 1

sums () { (cd "$1" && find . -type f -print0 | sort -z | xargs -0 sha256sum); }
fsfreeze -f "$tmpdir/mnt"
sums "$tmpdir/mnt" > "$tmpdir/sums.snap"
ms suspend t1
ms message pool 0 create_snap 2 1
ms resume t1
fsfreeze -u "$tmpdir/mnt"
ms create t2 --table "0 1048576 thin mapper:pool 2"
sleep 1
touch "$tmpdir/stop"; wait $load
sync

# The snapshot, copied: sparse, fsck-clean, the files of the freeze.
used=$(ms status pool | awk '{ split($6, a, "/"); print a[1] }')
nbdcopy "nbd+unix:///t2?socket=$sock" "$tmpdir/copy.img"
qemu-img convert -f raw -O qcow2 "nbd+unix:///t2?socket=$sock" \
         "$tmpdir/copy.qcow2"
alloc=$(( $(stat -c %b "$tmpdir/copy.img") * 512 ))
qalloc=$(( $(stat -c %b "$tmpdir/copy.qcow2") * 512 ))
echo "pool uses $used blocks ($((used * 65536)) bytes); nbdcopy wrote $alloc, qemu-img $qalloc"
[ $alloc -le $((used * 65536)) ] || die "nbdcopy's copy is not sparse"
[ $qalloc -le $((used * 65536 + 4 << 20)) ] || die "qemu-img's copy is not sparse"
qemu-img compare -f raw -F qcow2 "$tmpdir/copy.img" "$tmpdir/copy.qcow2" ||
    die "the two copies differ"
fsck.ext4 -fn "$tmpdir/copy.img" || die "fsck of the snapshot"
snaploop=$(loop_attach -r "$tmpdir/copy.img")
echo "$snaploop" > "$tmpdir/snaploop"
mount -t ext4 -o ro,noload "$snaploop" "$tmpdir/snap"
sums "$tmpdir/snap" | diff - "$tmpdir/sums.snap" ||
    die "the snapshot does not hold the files of the freeze"
ext4_umount "$tmpdir/snap"; losetup -d "$snaploop"; rm "$tmpdir/snaploop"

# The origin, after the writers.
ext4_umount "$tmpdir/mnt"
fsck.ext4 -fn "$loop" || die "fsck of the origin"
fuse_detach
ms remove t2
ms remove t1
stop_server ctl
thin_check "$md" || die "thin_check"
thin_delta --snap1 2 --snap2 1 "$md" > "$tmpdir/delta.xml" || die "thin_delta"
grep -Eq '<(different|right_only|left_only)' "$tmpdir/delta.xml" ||
    { head "$tmpdir/delta.xml"; die "thin_delta shows no change after the snapshot"; }
echo "$0: ok"
