#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The clone target's refusals and messages: every bad table is refused
# with a message naming the argument and changes nothing (no device, the
# metadata device left unformatted); damaged metadata (a checksum, the
# magic, a bitset array block, a btree node) and metadata of another
# geometry are refused naming the block or the field, and are not
# written; the messages change what status shows, bad ones are refused;
# discards mark whole regions hydrated without a copy and pass down
# (punching the destination) unless no_discard_passdown.  A metadata
# device that fails: the flush whose commit fails and every later one
# fail with EIO, so do writes, status says Fail (an event), and the
# failed clone's threads sleep (no commit retried in a loop); discards
# in fail mode are ignored unless their regions are hydrated (dm).  Two
# clones suspended and resumed in turn: each one's new workers are its
# own (a joined worker's thread id, reused, finds no suspended clone).
source "$(dirname "$0")/functions-ms.sh"
requires nbdsh --version
requires du --version

src=$(mkfile src.img 4M)
fill_random "$src" $((4 << 20)) 9
md=$(mkfile md.img 1M)
dest=$(mkfile dest.img 4M)
small=$(mkfile small.img 1M)
tiny=$(mkfile tiny.img 16K)
mkdir "$tmpdir/tables"
start_server --stderr "$tmpdir/log" ctl mapper tables="$tmpdir/tables"
t="0 8192 clone"

bad ()
{
    fails "$1" ms create x --table "$2"
    ms ls | grep -q '^x' && die "a refused table made device x"
    cmp -s "$md" <(head -c 1048576 /dev/zero) || die "a refused table wrote the metadata"
}
bad 'expected <metadata dev> <destination dev> <source dev> <region size>.*got 3 arguments' \
    "$t $md $dest $src"
bad 'invalid region size .7. \(sectors, 8 to 2097152\)' "$t $md $dest $src 7"
bad 'invalid region size .4194304. \(sectors, 8 to 2097152\)' "$t $md $dest $src 4194304"
bad 'invalid region size .x8.' "$t $md $dest $src x8"
bad 'region size 24 sectors is not a power of 2' "$t $md $dest $src 24"
bad '2 feature arguments declared but 1 given' "$t $md $dest $src 8 2 no_hydration"
bad "unrecognised clone feature 'hydrate' \\(expected no_hydration or no_discard_passdown\\)" \
    "$t $md $dest $src 8 1 hydrate"
bad 'invalid number of feature arguments' "$t $md $dest $src 8 3 a b c"
bad 'invalid hydration_threshold .0. \(regions, 1 to 4294967295\)' \
    "$t $md $dest $src 8 0 2 hydration_threshold 0"
bad 'invalid hydration_batch_size .-1.' \
    "$t $md $dest $src 8 0 2 hydration_batch_size -1"
bad "unrecognised core argument 'threshold'" "$t $md $dest $src 8 0 2 threshold 4"
bad 'core arguments come in pairs' "$t $md $dest $src 8 0 1 hydration_threshold"
bad '2 core arguments declared but 4 given|core argument' \
    "$t $md $dest $src 8 0 2 hydration_threshold 4 hydration_batch_size 4"
bad 'destination device' "$t $md $small $src 8"
bad 'source device' "$t $md $dest $small 8"
bad 'three different devices' "$t $md $dest $dest 8"
bad 'metadata device.*too small for 1024 regions' "$t $tiny $dest $src 8 0"
bad 'too many regions' "0 $(( (1 << 32) * 8 + 8 )) clone $md $dest $src 8"

# A good one; some regions hydrated; then damage.
ms create c --table "$t $md $dest $src 8 1 no_hydration"
nbdsh -u "nbd+unix:///c?socket=$sock" -c '
h.pwrite(b"\xaa" * 100, 4096 * 10 + 5)
h.pwrite(b"\xbb" * 8192, 4096 * 20)
h.flush()
'
ms status c | grep -q ' 8 3/1024 ' || die "3 regions hydrated: $(ms status c)"
ms remove c
python3 "$top_srcdir/tests/clone_md.py" check "$md" > "$tmpdir/md.out" || die "metadata"
grep -q 'hydrated: 10 20-21$' "$tmpdir/md.out" || die "metadata: $(cat "$tmpdir/md.out")"
cp "$md" "$tmpdir/md.good"

# flip BYTE OFFSET: a copy of the good metadata with one byte changed
flip ()
{
    cp "$tmpdir/md.good" "$md"
    python3 -c 'import sys
f = open(sys.argv[1], "r+b"); f.seek(int(sys.argv[2])); b = f.read(1)
f.seek(int(sys.argv[2])); f.write(bytes([b[0] ^ 0x40]))' "$md" "$1"
    cp "$md" "$tmpdir/md.bad"
}
refused ()
{
    fails "$1" ms create c --table "$2"
    cmp -s "$md" "$tmpdir/md.bad" || die "refused metadata was written"
}
# the bitset's btree root (a leaf here) and the array block it points to
broot=$(python3 -c 'import struct, sys
print(struct.unpack_from("<Q", open(sys.argv[1], "rb").read(), 188)[0])' "$tmpdir/md.good")
ablock=$(python3 -c 'import struct, sys
d = open(sys.argv[1], "rb").read(); n = int(sys.argv[2])
b = d[n * 4096:(n + 1) * 4096]
print(struct.unpack_from("<Q", b, 32 + 8 * struct.unpack_from("<I", b, 20)[0])[0])' "$tmpdir/md.good" "$broot")
echo "array block $ablock, bitset root $broot"
flip 100
refused 'metadata block 0 \(superblock\): checksum mismatch' "$t $md $dest $src 8"
flip 33
refused 'superblock: bad magic 0x8af23f64 \(not dm-clone metadata' "$t $md $dest $src 8"
flip $((ablock * 4096 + 24 + 1))
refused "metadata block $ablock \\(array block\\): checksum mismatch" "$t $md $dest $src 8"
flip $((broot * 4096 + 40))
refused "metadata block $broot \\(btree node\\): checksum mismatch" "$t $md $dest $src 8"
cp "$tmpdir/md.good" "$md"; cp "$md" "$tmpdir/md.bad"
refused 'superblock: region size 8 sectors, table says 16' "$t $md $dest $src 16"
refused 'superblock: target size 8192 sectors, table says 4096' "0 4096 clone $md $dest $src 8"

# The good metadata still opens: the hydrated regions are there.
ms create c --table "$t $md $dest $src 8 1 no_hydration"
ms status c | grep -q ' 8 3/1024 0 1 no_hydration 4 hydration_threshold 1 hydration_batch_size 1 rw$' ||
    die "status: $(ms status c)"

# A reload on the same metadata: another destination or geometry is
# refused; other core arguments keep the hydrated regions.
dest2=$(mkfile dest2.img 4M)
fails 'metadata device .* is in use by a clone onto destination .*dest.img' \
    ms reload c --table "$t $md $dest2 $src 8"
fails 'metadata device .* is in use by a clone of 8192 sectors with regions of 8 sectors' \
    ms reload c --table "$t $md $dest $src 16"
ms reload c --table "$t $md $dest $src 8 1 no_hydration 2 hydration_batch_size 2"
ms resume c
ms status c | grep -q ' 8 3/1024 0 1 no_hydration 4 hydration_threshold 1 hydration_batch_size 2 rw$' ||
    die "status after a reload: $(ms status c)"

# Messages.
fails "unrecognised message 'hydrate' with 0 arguments" ms message c 0 hydrate
fails 'enable_hydration takes no arguments, got 1' ms message c 0 enable_hydration now
fails 'disable_hydration takes no arguments, got 2' ms message c 0 disable_hydration 1 2
fails 'hydration_threshold takes 1 argument, got 0' ms message c 0 hydration_threshold
fails 'invalid hydration_threshold .0.' ms message c 0 hydration_threshold 0
fails 'invalid hydration_batch_size .x.' ms message c 0 hydration_batch_size x
ms message c 0 hydration_threshold 8
ms message c 0 hydration_batch_size 4
ms status c | grep -q ' 0 1 no_hydration 4 hydration_threshold 8 hydration_batch_size 4 rw$' ||
    die "status after messages: $(ms status c)"

# Discards: whole regions hydrated without a copy, passed down.
fallocate -l 4M "$dest"
nbdsh -u "nbd+unix:///c?socket=$sock" -c '
h.trim(4096 * 64, 4096 * 100)        # regions 100-163
h.trim(4096 * 2, 4096 * 200 + 512)   # parts of 200 and 202, all of 201
h.trim(100, 4096 * 300)              # part of 300 only: nothing
'
ms status c | grep -q ' 8 68/1024 ' || die "discards: $(ms status c)"
kb=$(du -k "$dest" | cut -f1)
[ "$kb" -le $((4096 - 256)) ] || die "discards not passed down: $kb KiB"
ms message c 0 enable_hydration
clone_hydrated c 1024
ms status c | grep -Eq ' 1024/1024 0 0 4 ' || die "hydration: $(ms status c)"
ms remove c

# no_discard_passdown: hydrated, the destination untouched.
: > "$md"; truncate -s 1M "$md"
cp "$src" "$dest"; fallocate -l 4M "$dest"
ms create c --table "$t $md $dest $src 8 2 no_hydration no_discard_passdown"
ms table c | grep -qx "$t $md $dest $src 8 2 no_hydration no_discard_passdown" ||
    die "table: $(ms table c)"
nbdsh -u "nbd+unix:///c?socket=$sock" -c 'h.trim(1 << 20, 0)'
ms status c | grep -q ' 8 256/1024 0 2 no_hydration no_discard_passdown 4 ' ||
    die "no_discard_passdown: $(ms status c)"
cmp "$dest" "$src" || die "no_discard_passdown: the destination was trimmed"
ms remove c

# The metadata device fails (mapper:meta replaced with an error table).
md2=$(mkfile md2.img 1M)
ms create meta --table "0 2048 linear $md2 0"
ms create c --table "$t mapper:meta $dest $src 8 1 no_hydration"
uri="nbd+unix:///c?socket=$sock"
nbdsh -u "$uri" -c 'h.pwrite(b"\1" * 4096, 4096 * 7); h.flush()'
e=$(ev c)
ms replace meta --table "0 2048 error"
nbdsh -u "$uri" -c '
import errno
h.pwrite(b"\2" * 100, 4096 * 9 + 5)    # region 9 hydrated, not committed
for i in range(2):
    try:
        h.flush()
        assert False, "a flush reported durable after the commit failed"
    except nbd.Error as e:
        assert e.errnum == errno.EIO, e
try:
    h.pwrite(b"\3" * 4096, 4096 * 7)
    assert False, "a write worked on a failed clone"
except nbd.Error as e:
    assert e.errnum == errno.EIO, e
' || die "failed metadata commit"
ms status c | grep -q ' clone Fail$' || die "status after the failed commit: $(ms status c)"
[ "$(ev c)" -gt "$e" ] || die "no event for fail mode"
# Discards in fail mode (dm's process_discard_bio): of regions not all
# hydrated, ignored (success; nothing marked, nothing passed down: the
# source still backs them); of hydrated ones (7), passed down.
same20 () { cmp -s "$dest" "$src" -i $((4096 * 20)) -n $((4096 * 4)); }
same20 || die "regions 20-23 of the destination are not the source's copy"
nbdsh -u "$uri" -c '
h.trim(4096 * 4, 4096 * 20)          # regions 20-23: unhydrated
h.trim(4096, 4096 * 7)               # region 7: hydrated
src = open("'"$src"'", "rb").read()
assert h.pread(4096 * 4, 4096 * 20) == src[4096 * 20:4096 * 24], \
    "a discard in fail mode marked regions hydrated"
assert h.pread(4096, 4096 * 7) == bytes(4096), \
    "a discard of a hydrated region in fail mode was not passed down"
' || die "discards in fail mode"
same20 || die "a discard in fail mode punched unhydrated regions of the destination"
ms status c | grep -q ' clone Fail$' || die "status after discards: $(ms status c)"
# CPU time (clock ticks) of the clone's threads: they sleep.
ticks ()
{
    local t sum=0
    for t in /proc/"$(cat "$tmpdir/ctl.pid")"/task/*; do
        grep -qx mapper-clone "$t/comm" 2>/dev/null || continue
        sum=$((sum + $(sed 's/.*) //' "$t/stat" | awk '{ print $12 + $13 }')))
    done
    echo "$sum"
}
t0=$(ticks); sleep 2; t1=$(ticks)
[ $((t1 - t0)) -lt 50 ] || die "a failed clone's threads busy: $((t1 - t0)) ticks in 2 s"
# The metadata device works again: a reload leaves fail mode, at the
# last commit (region 7 hydrated; region 9's write was never flushed).
ms replace meta --table "0 2048 linear $md2 0"
ms reload c --table "$t mapper:meta $dest $src 8 1 no_hydration"
ms resume c
ms status c | grep -q ' 8 [0-9]*/256 8 1/1024 0 1 no_hydration ' ||
    die "status after a reload of the failed clone: $(ms status c)"
nbdsh -u "$uri" -c 'h.pwrite(b"\4" * 4096, 4096 * 11); h.flush()' ||
    die "the reloaded clone still fails"
ms status c | grep -q ' 8 [0-9]*/256 8 2/1024 0 1 no_hydration ' ||
    die "status after a write to the reloaded clone: $(ms status c)"
ms remove c
ms remove meta

# Two clones, suspended and resumed in turn: a worker started for one
# must not take itself for a worker of the other, suspended (its table
# unbound: the server crashed).
for x in a b; do
    mkfile md$x.img 1M > /dev/null
    mkfile dest$x.img 4M > /dev/null
    ms create $x --table "$t $tmpdir/md$x.img $tmpdir/dest$x.img $src 8 1 no_hydration"
done
pid=$(cat "$tmpdir/ctl.pid")
for (( i = 0; i < 20; i++ )); do
    ms suspend a
    ms suspend b
    ms resume a
    ms resume b
done
sleep 1.2                       # past worker 0's periodic commit
kill -0 "$pid" || die "the server died"
nw=$(grep -lx mapper-clone /proc/"$pid"/task/*/comm | wc -l)
[ "$nw" -eq 8 ] || die "two unhydrated clones run $nw mapper-clone threads, not 8"
ms remove a
ms remove b
echo "$0: ok"
