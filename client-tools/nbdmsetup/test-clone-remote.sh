#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# dm-clone's use case: a clone whose source is a remote read-only NBD
# export (nbdkit file -r, sparse), used by fio --verify from the first
# second, hydrated in the background meanwhile (enable_hydration while
# fio runs: 4 KiB partial-region writes hydrate their region first,
# 64 KiB ones overwrite whole regions), hydrated completely (an event,
# status N/N), then replaced by a linear table on the destination
# (nbdmsetup reload + resume): the device reads the same before and
# after, the destination equals the source plus the client's writes, the
# source was never written, the destination stayed sparse where the
# source is (du), and tests/clone_md.py, reading the metadata on its own,
# finds every region hydrated.  Then a clone copying large runs to a
# remote destination that cannot zero ends up equal to the source.
source "$(dirname "$0")/functions-ms.sh"
requires nbdsh --version
requires nbdinfo --version
requires fio --version
requires sh -c 'fio --enghelp=nbd 2>&1 | grep -q uri'
requires du --version

size=$((32 << 20)) sectors=$((32 << 11))
src=$(mkfile src.img 32M)
# data in [0, 12M) and [20M, 24M); the rest a hole
fill_random "$tmpdir/data" $((12 << 20)) 7
dd if="$tmpdir/data" of="$src" conv=notrunc status=none
dd if="$tmpdir/data" of="$src" bs=1M count=4 seek=20 conv=notrunc status=none
cp --sparse=always "$src" "$tmpdir/src.orig"
md=$(mkfile md.img 4M)
dest=$(mkfile dest.img 32M)
start_server srcsrv -r file "$src"
mkdir "$tmpdir/tables"
start_server --stderr "$tmpdir/log" ctl -f mapper tables="$tmpdir/tables"
srcuri="nbd+unix:///?socket=$tmpdir/srcsrv.sock"
# 8 KiB regions; hydration off at first, one region at a time (dm's
# defaults) once enabled, so that fio and the workers overlap.
ms create c --table "0 $sectors clone $md $dest $srcuri 16 1 no_hydration"
ms status c | grep -Eq '^0 65536 clone 8 [0-9]+/1024 16 0/4096 0 1 no_hydration 4 hydration_threshold 1 hydration_batch_size 1 rw$' ||
    die "status at creation: $(ms status c)"
ms table c | grep -qx "0 65536 clone $md $dest $srcuri 16 1 no_hydration" ||
    die "table: $(ms table c)"
ms info c | grep -q 'Read only' && die "the clone is read-only"

# Before any write: the source's data, and its holes as holes.
nbdsh -u "nbd+unix:///c?socket=$sock" -c '
assert h.pread('$size', 0) == open("'"$tmpdir/src.orig"'", "rb").read()
'
nbdinfo --map "nbd+unix:///c?socket=$sock" > "$tmpdir/map0"
grep -Eq '^ +12582912 +8388608 +3 +hole,zero$' "$tmpdir/map0" ||
    { cat "$tmpdir/map0"; die "map: the source's hole"; }

ev0=$(ev c)
cat > "$tmpdir/fio.job" <<EOF
[global]
ioengine=nbd
uri=nbd+unix:///c?socket=$sock
verify=crc32c
verify_fatal=1
verify_backlog=64
rw=randwrite
iodepth=8
[partial]
bs=4k
offset=0
size=6M
[whole]
bs=64k
offset=16M
size=8M
EOF
(cd "$tmpdir" && fio "$tmpdir/fio.job" > "$tmpdir/fio.out" 2>&1) &
fio=$!
sleep 1
ms message c 0 enable_hydration
wait $fio || { cat "$tmpdir/fio.out"; die "fio failed"; }
if grep -Ei 'verify.*(fail|bad)|bad magic|crc32c.*wanted|err= *[1-9]' \
        "$tmpdir/fio.out"; then cat "$tmpdir/fio.out"; die "fio verify"; fi
echo "after fio: $(ms status c)"

# What the client sees now: outside fio's ranges, the source.
nbdsh -u "nbd+unix:///c?socket=$sock" -c '
got = h.pread('$size', 0)
src = open("'"$tmpdir/src.orig"'", "rb").read()
M = 1 << 20
assert got[6 * M:16 * M] == src[6 * M:16 * M], "source data lost"
assert got[24 * M:] == src[24 * M:], "source data lost"
assert got[:6 * M] != src[:6 * M] and got[16 * M:24 * M] != src[16 * M:24 * M]
open("'"$tmpdir/seen"'", "wb").write(got)
'
ms message c 0 hydration_threshold 64
ms message c 0 hydration_batch_size 16
clone_hydrated c 4096
ms status c | grep -Eq '^0 65536 clone 8 [0-9]+/1024 16 4096/4096 0 0 4 hydration_threshold 64 hydration_batch_size 16 rw$' ||
    die "not hydrated: $(ms status c)"
[ "$(ev c)" -gt "$ev0" ] || die "no event for the end of hydration"
grep -q 'clone: device c: hydration complete: 4096 regions' "$tmpdir/log" ||
    die "no log line for the end of hydration"
# Hydrated, the clone keeps one worker (its once-a-second commit), not
# the four that copied: a finished clone waiting for its linear table
# costs one sleeping thread.
for (( i = 0; i < 50; i++ )); do
    nw=$(grep -lx mapper-clone /proc/"$(cat "$tmpdir/ctl.pid")"/task/*/comm |
             wc -l)
    [ "$nw" -eq 1 ] && break
    sleep 0.1
done
[ "$nw" -eq 1 ] || die "a hydrated clone keeps $nw mapper-clone threads"

# Replace by linear on the destination, as dm-clone's documentation says.
ms reload c --table "0 $sectors linear $dest 0"
ms resume c
ms table c | grep -qx "0 65536 linear $dest 0" || die "not linear: $(ms table c)"
nbdsh -u "nbd+unix:///c?socket=$sock" -c '
assert h.pread('$size', 0) == open("'"$tmpdir/seen"'", "rb").read(), \
    "linear on the destination reads otherwise"
'
cmp "$dest" "$tmpdir/seen" || die "destination != source + writes"
cmp "$src" "$tmpdir/src.orig" || die "the source was written"
python3 "$top_srcdir/tests/clone_md.py" check "$md" --all ||
    die "clone_md.py: metadata"
# The source's holes that fio did not write (12M-16M, 24M-32M) are holes
# on the destination too: 16 MiB of the source's data and fio's 4 MiB
# in its hole at 16M-20M are allocated, no more.
kb=$(du -k "$dest" | cut -f1)
echo "destination: $kb KiB allocated of 32768"
[ "$kb" -le $((20 * 1024 + 256)) ] ||
    die "the destination is not sparse: $kb KiB"

# Large runs (512 KiB regions, 16 at a time: 8 MiB, across the 4 MiB at
# which a copy asks the source's extents) to a remote destination that
# cannot zero (nbdkit memory behind the nozero filter, filled with other
# data first): the backend writes the source's holes as zeros.  The
# client first writes the whole region at 12.5M, in the source's hole
# (12M-20M): hydrated by that write, it is never copied over, though the
# run before it (8M-12.5M) crosses from data into that hole in its
# first 4 MiB, and the source's extents (asked for well ahead) go on.
dest2=nbd+unix:///?socket=$tmpdir/dest2.sock
start_server dest2 --filter=nozero memory 32M
nbdinfo --can zero "$dest2" && die "the nozero destination can zero"
fill_random "$tmpdir/junk" "$size" 9
nbdcopy "$tmpdir/junk" "$dest2"
md2=$(mkfile md2.img 4M)
ms create c2 --table "0 $sectors clone $md2 $dest2 $srcuri 1024 1 no_hydration 4 hydration_threshold 64 hydration_batch_size 16"
fill_random "$tmpdir/mine" 524288 11
nbdsh -u "nbd+unix:///c2?socket=$sock" -c '
h.pwrite(open("'"$tmpdir/mine"'", "rb").read(), 25 << 19)
h.flush()
'
ms message c2 0 enable_hydration
clone_hydrated c2 64
python3 - "$tmpdir/src.orig" "$tmpdir/mine" "$tmpdir/want2" <<'PY'
import sys
d = bytearray(open(sys.argv[1], "rb").read())
d[25 << 19:26 << 19] = open(sys.argv[2], "rb").read()
open(sys.argv[3], "wb").write(d)
PY
nbdcopy "$dest2" "$tmpdir/dest2.img"
cmp "$tmpdir/dest2.img" "$tmpdir/want2" ||
    die "large runs to a destination without zero: it differs from the source and the client's write"
ms remove c2
stop_server ctl
echo "$0: ok"
