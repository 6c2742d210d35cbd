#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# A two-leg mirror under fio --verify, one leg on a small tmpfs that fills
# up mid-run (writes to it fail with ENOSPC): with handle_errors the
# client sees no error and the leg's status turns D.  Then the leg is
# replaced (a new "sync" table over a fresh leg): resync completes, status
# returns to all A, the legs are byte-identical, and fio verifies the data
# again through the mirror (reads spread over both legs).
source "${top_srcdir:-$(dirname "$0")/..}/tests/functions.sh"

requires nbdkit --version
requires fio --version
requires sh -c 'fio --enghelp=nbd 2>&1 | grep -q uri'
requires test "$(id -u)" = 0

mnt="$tmpdir/mnt"
mkdir "$mnt"
mount -t tmpfs -o size=8M tmpfs "$mnt" 2>/dev/null || {
    echo "$0: skipped: cannot mount a tmpfs"; exit 77; }
cleanup_fn umount "$mnt"

leg0=$(mkfile leg0.img 32M)
truncate -s 32M "$mnt/leg1.img"         # only 8M of it can be written
cat > "$tmpdir/m.table" <<EOF
0 65536 mirror core 2 1024 nosync 2 $leg0 0 $mnt/leg1.img 0 1 handle_errors
EOF

fio_args="--ioengine=nbd --direct=1 --verify_state_save=0 --verify=crc32c"
fio_args+=" --verify_fatal=1 --randrepeat=1 --randseed=42 --name=mirror"
fio_args+=" --rw=randwrite --bs=64k --size=32M --iodepth=8"
cat > "$tmpdir/fio.sh" <<EOF
set -e
cd "$tmpdir"
fio $fio_args --do_verify=1 --uri="nbd+unix:///m?socket=\$1" "\${@:2}" \
    > "$tmpdir/fio.out" 2>&1 || { cat "$tmpdir/fio.out"; exit 1; }
if grep -Ei 'verify.*(fail|bad)|bad magic|crc32c.*wanted|err= *[1-9]' \
        "$tmpdir/fio.out"; then cat "$tmpdir/fio.out"; exit 1; fi
grep -E 'WRITE:|READ:' "$tmpdir/fio.out" || :
EOF

# 1. The tmpfs leg fills up during the run.
mapper -f -v -U - "$tmpdir/m.table" \
       --run "bash '$tmpdir/fio.sh' \"\$unixsocket\"" 2> "$tmpdir/log1" || {
    tail -20 "$tmpdir/log1"; die "fio failed with a dying leg"; }
grep 'mirror .*leg 1 .*failed a write' "$tmpdir/log1" ||
    die "leg 1 never failed (tmpfs not full?)"
grep -E 'mirror .*failed a write\): 2 \S+ \S+ 64/64 1 AD 1 core' \
     "$tmpdir/log1" || die "status does not show leg 1 as D"

# 2. Replace the leg: a "sync" table over a fresh leg resyncs it.
leg2=$(mkfile leg2.img 32M)
cat > "$tmpdir/m.table" <<EOF
0 65536 mirror core 2 1024 sync 2 $leg0 0 $leg2 0 1 handle_errors
EOF
start_server --stderr "$tmpdir/log2" m -f -v mapper "$tmpdir/m.table"
wait_for grep -q 'resync complete' "$tmpdir/log2" ||
    { tail -20 "$tmpdir/log2"; die "resync did not complete"; }
bash "$tmpdir/fio.sh" "$tmpdir/m.sock" --verify_only ||
    { tail -20 "$tmpdir/log2"; die "verify after resync failed"; }
stop_server m
grep -E 'resync complete\): 2 \S+ \S+ 64/64 1 AA 1 core' "$tmpdir/log2" ||
    die "status after resync is not all A"
cmp "$leg0" "$leg2" || die "legs differ after resync"

echo "$0: ok"
