#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The xfstests power-cut pattern on a flakey device with ext4 (through
# nbdfuse and a loop device), switching tables live with nbdmsetup:
#   1. flakey always up: mkfs, mount, write files and fsync them;
#   2. replace the table with drop_writes (always down) while mounted:
#      write more files, sync, unmount - every write is silently lost;
#   3. replace the table with always up again and attach afresh (no
#      cached blocks): fsck replays the journal and leaves a clean
#      filesystem, the fsynced files are there with their data, the
#      files written while down are not.
# Skips (77) unless nbdmsetup is built and loop devices, ext4 and FUSE
# work here.
source "${top_srcdir:-$(dirname "$0")/..}/tests/functions.sh"

: "${NBDMSETUP:=$top_builddir/client-tools/nbdmsetup/nbdmsetup}"
requires test -x "$NBDMSETUP"
requires nbdkit --version
ext4_fuse_preflight

f=$(mkfile fs.img 96M)
f=$(realpath "$f")
len=$(( 96 * 2048 - 8 ))
echo "0 $len flakey $f 8 1 0" > "$tmpdir/up.table"
echo "0 $len flakey $f 8 0 1 1 drop_writes" > "$tmpdir/drop.table"
cp "$tmpdir/up.table" "$tmpdir/dev.table"

sock=$tmpdir/dev.sock
ctl="nbd+unix:///control?socket=$sock"
uri="nbd+unix:///dev?socket=$sock"
ms () { "$NBDMSETUP" -a "$ctl" "$@"; }
mkdir "$tmpdir/fuse" "$tmpdir/mnt"

# attach: nbdfuse + a fresh loop device (no blocks cached from before).
attach () { fuse_attach "$uri" || die "nbdfuse did not come up"; }

sums () { (cd "$tmpdir/mnt" && find . -type f -print0 | sort -z | xargs -0 sha256sum); }

start_server dev mapper "$tmpdir/dev.table"
# After the server's: the mount goes before its server does.
cleanup_fn fuse_detach
ms status dev || die "nbdmsetup cannot reach the server"

# 1. Up: a filesystem with fsynced files.
attach
mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 "$loop"
mount -t ext4 "$loop" "$tmpdir/mnt"
mkdir "$tmpdir/mnt/kept"
python3 - "$tmpdir/mnt/kept" <<'EOF'
import os, random, sys
rng = random.Random(1)
for i in range(40):
    p = os.path.join(sys.argv[1], "f%02d" % i)
    with open(p, "wb") as f:
        f.write(rng.randbytes(rng.choice([1, 4095, 4097, 70000, 1 << 20])))
        f.flush()
        os.fsync(f.fileno())
fd = os.open(sys.argv[1], os.O_RDONLY)
os.fsync(fd)
os.close(fd)
EOF
sums > "$tmpdir/kept.sums"

# 2. Power cut: drop every write from now on; write more, unmount.
ms replace dev "$tmpdir/drop.table" || die "replace with drop_writes"
ms table dev | grep -q drop_writes || die "drop_writes table not live"
mkdir "$tmpdir/mnt/lost"
dd if=/dev/urandom of="$tmpdir/mnt/lost/big" bs=1M count=8 status=none
dd if=/dev/urandom of="$tmpdir/mnt/kept/f00" bs=4k count=3 conv=notrunc,fsync \
   status=none
rm -f "$tmpdir/mnt/kept/f01"
sync
ext4_umount "$tmpdir/mnt"
fuse_detach

# 3. Power back: replay, check.
ms replace dev "$tmpdir/up.table" || die "replace with the up table"
attach
rc=0
fsck.ext4 -fy "$loop" > "$tmpdir/fsck1.out" 2>&1 || rc=$?
cat "$tmpdir/fsck1.out"
[ $rc -le 1 ] || die "fsck.ext4 -fy could not recover (exit $rc)"
fsck.ext4 -fn "$loop" > "$tmpdir/fsck2.out" 2>&1 ||
    { cat "$tmpdir/fsck2.out"; die "filesystem not clean after recovery"; }
mount -t ext4 -o ro "$loop" "$tmpdir/mnt"
[ -e "$tmpdir/mnt/lost" ] && die "a directory made while down survived"
sums > "$tmpdir/after.sums"
cmp "$tmpdir/kept.sums" "$tmpdir/after.sums" ||
    { diff "$tmpdir/kept.sums" "$tmpdir/after.sums" | head; \
      die "fsynced files changed or lost"; }
ext4_umount "$tmpdir/mnt"
fuse_detach

echo "$0: ok"
