#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# An ext4 test's mounts are its own (private_mounts, functions.sh): a
# mount namespace made meanwhile from the one the test started in - as
# "ip netns exec" in another suite's netns test does, here unshare -m -
# holds no copy of them, so umount takes the filesystem down and its
# last writes reach the server.  Before, such a copy kept the filesystem
# mounted after the test's umount: fsck found wrong free counts and a
# fresh server read the files as they were before the last writes
# (test-ext4.sh's failures under load).  And ext4_umount fails, naming
# the holder, when a copy does hold the filesystem.
source "${top_srcdir:-$(dirname "$0")/..}/tests/functions.sh"

requires nbdkit --version
requires nsenter --version
ext4_fuse_preflight
[ -n "${NBDMAPPER_OUTER_MNT_NS:-}" ] ||
    { echo "$0: skipped: no mount namespace of its own"; exit 77; }

f=$(mkfile fs.img 64M)
echo "0 131072 linear $f 0" > "$tmpdir/fs.table"
uri="nbd+unix:///fs?socket=$tmpdir/fs.sock"
mkdir "$tmpdir/fuse" "$tmpdir/mnt"
start_server fs mapper "$tmpdir/fs.table"
cleanup_fn fuse_detach
sums () { (cd "$tmpdir/mnt" && find . -type f -print0 | sort -z |
               xargs -0 sha256sum); }
holders=()
cleanup_fn 'for p in "${holders[@]}"; do kill "$p"; wait "$p"; done 2>/dev/null'
# hold [NSENTER-ARGS...]: a process in a new mount namespace, a copy of
# ours or (with --mount=...) of another; its pid in $holder.
hold ()
{
    nsenter "$@" -- unshare -m --propagation private sleep 600 &
    holder=$!
    holders+=("$holder")
    # nsenter and unshare exec in turn: sleep runs once the copy is made.
    wait_for grep -qx sleep "/proc/$holder/comm" || die "no holder"
}

fuse_attach "$uri" || die "nbdfuse did not come up"
mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 "$loop"
mount -t ext4 "$loop" "$tmpdir/mnt"
dd if=/dev/urandom of="$tmpdir/mnt/big" bs=1M count=8 status=none
for i in $(seq 20); do head -c $((i * 3001)) /dev/urandom > "$tmpdir/mnt/f$i"; done
sync

# 1. Another suite's namespace, made while mounted: the last writes and
#    the umount after it are not lost to it.
hold --mount="$NBDMAPPER_OUTER_MNT_NS"
dd if=/dev/urandom of="$tmpdir/mnt/big" bs=4k count=100 seek=50 \
   conv=notrunc status=none
rm "$tmpdir/mnt/f3" "$tmpdir/mnt/f7"
sums > "$tmpdir/sums"
umount "$tmpdir/mnt"
bad=
if [ -e "/sys/fs/ext4/${loop##*/}" ]; then
    bad+=" still mounted after umount (in $(grep -l " $loop " \
        /proc/[0-9]*/mountinfo | tr '\n' ' '));"
fi
rc=0
fsck.ext4 -fn "$loop" > "$tmpdir/fsck.out" 2>&1 || rc=$?
cat "$tmpdir/fsck.out"
[ "$rc" -eq 0 ] || bad+=" fsck exit $rc;"
! grep -Eq 'in use|count wrong|recovery' "$tmpdir/fsck.out" ||
    bad+=" fsck: $(grep -E 'in use|count wrong|recovery' "$tmpdir/fsck.out" |
                   head -3 | tr '\n' ' ');"
fuse_detach

# A fresh server and mount: the files as they were at the umount.
stop_server fs
start_server fs mapper "$tmpdir/fs.table"
fuse_attach "$uri" || die "nbdfuse did not come up again"
mount -t ext4 -o ro "$loop" "$tmpdir/mnt"
sums | diff "$tmpdir/sums" - > "$tmpdir/sums.diff" ||
    bad+=" files differ on a fresh server: $(head -c 300 "$tmpdir/sums.diff");"
[ -z "$bad" ] || die "a namespace made elsewhere held the filesystem:$bad"
echo "the filesystem went down at umount; $(wc -l < "$tmpdir/sums") files" \
     "read back on a fresh server"

# 2. A copy of our own namespace does hold it: ext4_umount says so, and
#    by whom.
hold
rc=0
( ext4_umount "$tmpdir/mnt" ) 2> "$tmpdir/umount.err" || rc=$?
cat "$tmpdir/umount.err"
[ "$rc" -eq 1 ] || die "ext4_umount with the filesystem held: exit $rc, not 1"
grep -q "umount $tmpdir/mnt: the ext4 on $loop is still mounted elsewhere" \
     "$tmpdir/umount.err" || die "ext4_umount: no message"
grep -q "pid $holder (sleep 600 ) mounts $loop" "$tmpdir/umount.err" ||
    die "ext4_umount does not name the holder $holder"
kill "$holder"; wait "$holder" 2>/dev/null || :
wait_for test ! -e "/sys/fs/ext4/${loop##*/}" ||
    die "the filesystem outlived its holder"
fuse_detach

echo "$0: ok"
