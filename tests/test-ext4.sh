#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# A real filesystem on a striped device: nbdfuse exposes the device as a
# file, a loop device turns it into a block device; mkfs.ext4, mount, write
# files, umount, fsck clean, remount and compare checksums; then a fresh
# server (nothing cached) mounts it again and fsck is still clean.
source "${top_srcdir:-$(dirname "$0")/..}/tests/functions.sh"

requires nbdkit --version
ext4_fuse_preflight

# The device: 3 stripes, chunk 24 sectors (12K, not a power of two), then
# a linear tail; about 97M.
for f in s0 s1 s2 t; do mkfile $f.img 40M >/dev/null; done
nchunks=2731
len=$(( 3 * 24 * nchunks ))
cat > "$tmpdir/fs.table" <<EOF
0 $len striped 3 24 $tmpdir/s0.img 0 $tmpdir/s1.img 8 $tmpdir/s2.img 1
$len 2048 linear $tmpdir/t.img 5
EOF

mkdir "$tmpdir/fuse" "$tmpdir/mnt"

cleanup_fn fuse_detach

# The script run by nbdkit --run: PHASE is "create" or "check".
cat > "$tmpdir/phase.sh" <<'EOF'
set -e
set -u
tmpdir=$1 uri=$2 phase=$3
source "$tmpdir/cleanup.sh"
trap fuse_detach EXIT

fuse_attach "$uri" || { echo "nbdfuse did not come up"; exit 1; }
[ "$(stat -c %s "$tmpdir/fuse/nbd")" -eq "$4" ] ||
    { echo "FUSE file has the wrong size"; exit 1; }
echo "loop device: $loop"

# evidence WHAT: on a failure, what tells where the bad blocks come
# from, in $tmpdir/evidence (kept with NBDMAPPER_KEEP_FAILED, see
# functions.sh): the loop device's binding and every loop device of the
# machine at that moment, and the device's content as read four ways -
# through the loop device (its page cache, and O_DIRECT), through the
# FUSE file and from the server on a new connection - each checked by
# fsck.  (The failures under load were a filesystem held mounted by
# another mount namespace, see private_mounts: all four agreed, on the
# blocks of before the last writes.)
evidence ()
{
    local e=$tmpdir/evidence
    mkdir -p "$e"
    {
        echo "failed: $1 (phase $phase, loop $loop)"
        losetup -l -O NAME,BACK-FILE,DIO,AUTOCLEAR,OFFSET "$loop"
        echo "--- losetup -a"; losetup -a
        echo "--- mounts"; grep -e " $tmpdir/" /proc/mounts
    } > "$e/info" 2>&1
    if [ -n "${NBDMAPPER_KEEP_FAILED:-}" ]; then
        if mountpoint -q "$tmpdir/mnt"; then umount "$tmpdir/mnt" || :; fi
        dd if="$loop" of="$e/via-loop.img" bs=1M status=none || :
        dd if="$loop" of="$e/via-loop-direct.img" bs=1M iflag=direct \
           status=none || :
        dd if="$tmpdir/fuse/nbd" of="$e/via-fuse.img" bs=1M status=none || :
        nbdcopy "$uri" "$e/via-server.img" || :
        for i in via-loop via-loop-direct via-fuse via-server; do
            echo "--- $i: $(sha256sum < "$e/$i.img")"
            fsck.ext4 -fn "$e/$i.img" 2>&1 | tail -n 3
        done >> "$e/info" 2>&1
    fi
    cat "$e/info"
}

fsck_clean ()
{
    local rc=0
    fsck.ext4 -fn "$loop" > "$tmpdir/fsck.out" 2>&1 || rc=$?
    cat "$tmpdir/fsck.out"
    [ $rc -eq 0 ] ||
        { echo "fsck.ext4 -fn exit $rc"; evidence "fsck $rc"; exit 1; }
    # -n answers no and may still exit 0: wrong free counts, a device in
    # use (mounted elsewhere) are not a clean filesystem.
    ! grep -Eq 'Fix\? no|is in use|recovery' "$tmpdir/fsck.out" ||
        { echo "fsck.ext4 -fn: not clean"; evidence "fsck output"; exit 1; }
}

sums ()
{
    (cd "$tmpdir/mnt" && find . -type f -print0 | sort -z |
         xargs -0 sha256sum)
}

if [ "$phase" = create ]; then
    mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 "$loop"
    fsck_clean
    mount -t ext4 "$loop" "$tmpdir/mnt"
    # A big file, many small files of odd sizes, nested directories, a
    # sparse file and some renames and deletes.
    dd if=/dev/urandom of="$tmpdir/mnt/big" bs=1M count=24 status=none
    mkdir -p "$tmpdir/mnt/d1/d2/d3"
    python3 - "$tmpdir/mnt" <<'PYEOF'
import os, random, sys
root = sys.argv[1]
rng = random.Random(7)
for i in range(300):
    d = rng.choice(["", "d1", "d1/d2", "d1/d2/d3"])
    with open(os.path.join(root, d, "f%03d" % i), "wb") as f:
        f.write(rng.randbytes(rng.choice([1, 511, 4095, 4097, 12289,
                                          rng.randrange(1, 200000)])))
with open(os.path.join(root, "sparse"), "wb") as f:
    for off in (0, 5 << 20, 11 << 20):
        f.seek(off)
        f.write(rng.randbytes(70000))
for i in range(0, 300, 7):
    for d in ["", "d1", "d1/d2", "d1/d2/d3"]:
        p = os.path.join(root, d, "f%03d" % i)
        if os.path.exists(p):
            os.rename(p, p + ".renamed")
for i in range(3, 300, 11):
    for d in ["", "d1", "d1/d2", "d1/d2/d3"]:
        p = os.path.join(root, d, "f%03d" % i)
        if os.path.exists(p):
            os.unlink(p)
PYEOF
    sums > "$tmpdir/sums"
    sync
    ext4_umount "$tmpdir/mnt"
    fsck_clean
    mount -t ext4 "$loop" "$tmpdir/mnt"
    sums > "$tmpdir/sums2"
    cmp "$tmpdir/sums" "$tmpdir/sums2" ||
        { diff "$tmpdir/sums" "$tmpdir/sums2" | head; evidence sums2; exit 1; }
    # Overwrite part of the big file in place, and trim free space.
    dd if=/dev/urandom of="$tmpdir/mnt/big" bs=4k count=300 seek=1000 \
       conv=notrunc status=none
    rm -f "$tmpdir/mnt/d1/d2/f00"*
    fstrim -v "$tmpdir/mnt" 2>/dev/null || :
    sums > "$tmpdir/sums"
    ext4_umount "$tmpdir/mnt"
    fsck_clean
else
    fsck_clean
    mount -t ext4 -o ro "$loop" "$tmpdir/mnt"
    sums > "$tmpdir/sums3"
    cmp "$tmpdir/sums" "$tmpdir/sums3" ||
        { diff "$tmpdir/sums" "$tmpdir/sums3" | head; evidence sums3; exit 1; }
    echo "$(wc -l < "$tmpdir/sums3") files verified after restart"
    ext4_umount "$tmpdir/mnt"
fi
EOF
declare -f fuse_detach fuse_attach loop_attach wait_for ext4_umount die > "$tmpdir/cleanup.sh"
echo "tmpdir=$(printf %q "$tmpdir")" >> "$tmpdir/cleanup.sh"

size=$(( (len + 2048) * 512 ))
for phase in create check; do
    echo "=== $phase"
    mapper -U - "$tmpdir/fs.table" \
        --run "bash '$tmpdir/phase.sh' '$tmpdir' \"\$uri\" $phase $size" ||
        die "phase $phase failed"
    fuse_detach
done

echo "$0: ok"
