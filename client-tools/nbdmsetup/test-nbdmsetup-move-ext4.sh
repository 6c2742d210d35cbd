#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdmsetup move of a mounted ext4 volume (nbdfuse + a loop device) from
# two local files to a remote server (nbdkit file on a Unix socket,
# writes slowed by its delay filter so that the copy takes a while),
# while files are written: the filesystem stays mounted and in use
# throughout, then is fsck-clean through the moved device, and the
# remote server's file alone (the sources set aside) is an fsck-clean
# ext4 holding exactly the files seen on the mount.
source "$(dirname "$0")/functions-ms.sh"
requires nbdkit file --version
requires nbdkit --filter=delay null --version
ext4_fuse_preflight

mkdir "$tmpdir/fuse" "$tmpdir/mnt" "$tmpdir/check" "$tmpdir/tables"
a=$(mkfile a.img 64M)
b=$(mkfile b.img 64M)
dst=$(mkfile dst.img 128M)
start_server dst --filter=delay file "$dst" wdelay=2ms
durl="nbd+unix:///?socket=$tmpdir/dst.sock"
start_server --stderr "$tmpdir/log" ctl mapper tables="$tmpdir/tables"
ms create vol --table "0 131072 linear $a 0
131072 131072 linear $b 0"
cleanup_fn fuse_detach
cleanup_fn 'umount "$tmpdir/check" 2>/dev/null; [ ! -s "$tmpdir/checkloop" ] || losetup -d "$(cat "$tmpdir/checkloop")" 2>/dev/null || :'

fuse_attach "nbd+unix:///vol?socket=$sock" || die "nbdfuse did not come up"
ext4_fill 40
ext4_writers 30 10              # fsync'ing now and then, until told to stop

# Regions of 128 KiB: 1024 of them, each copied at 2 ms a write or more.
ms move --region-size 256 vol "$durl" > "$tmpdir/move.out" 2>&1 ||
    { cat "$tmpdir/move.out"; die "move vol failed"; }
tail -n 3 "$tmpdir/move.out"
[ "$(ms table vol)" = "0 262144 linear $durl 0" ] ||
    die "vol after the move: $(ms table vol)"
# The writers ran all along, and go on on DEST.
kill -0 $load || die "the writers stopped during the move"
sleep 1
touch "$tmpdir/stop"; wait $load
echo "$(cat "$tmpdir/writes") files written meanwhile"
[ "$(cat "$tmpdir/writes")" -gt 0 ] || die "nothing was written during the move"
sync

sums () { (cd "$1" && find . -type f ! -name stop ! -name writes -print0 |
               sort -z | xargs -0 sha256sum); }
sums "$tmpdir/mnt" > "$tmpdir/sums"
ext4_umount "$tmpdir/mnt"
fsck.ext4 -fn "$loop" || die "fsck through the moved device"
fuse_detach

# DEST alone: the sources out of the way.
mv "$a" "$a.old"; mv "$b" "$b.old"
stop_server ctl     # its connections to dst first: nbdkit waits for its clients
stop_server dst
fsck.ext4 -fn "$dst" || die "fsck of DEST's file"
checkloop=$(loop_attach -r "$dst")
echo "$checkloop" > "$tmpdir/checkloop"
mount -t ext4 -o ro,noload "$checkloop" "$tmpdir/check"
sums "$tmpdir/check" | diff - "$tmpdir/sums" ||
    die "DEST does not hold the files seen on the mount"
ext4_umount "$tmpdir/check"; losetup -d "$checkloop"; rm "$tmpdir/checkloop"
echo "$0: ok"
