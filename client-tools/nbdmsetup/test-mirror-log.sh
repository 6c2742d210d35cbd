#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The mirror's disk log (dm-log's "disk" type, its on-disk format):
#  1. a new log: every region resynced, holes of the source skipped (the
#     destination stays sparse: du), a hole over stale data zeroed; the
#     log is all clean once resync completes;
#  2. a write makes its region's bit dirty on the log device before it
#     is acknowledged; a flush with no write since the previous one
#     cleans it;
#  3. kill -9 during writes to 8 of the 64 regions: the restarted server
#     (same tables=DIR) resyncs exactly the regions the log had dirty,
#     counted, and the legs are identical afterwards;
#  4. a reload with the same log keeps it (nothing resynced); another
#     region size re-initialises it (everything resynced), at resume
#     only: until then the live table's log is left as it is;
#  5. bad log devices are refused naming the place, changing nothing;
#  6. a log that cannot be read again at resume: every region resyncs;
#  7. a log device whose flush fails: the client's flush fails, status
#     shows the log's F;
#  8. a suspend, and a clean server stop, leave the log clean: nothing
#     resyncs at the next start.
source "$(dirname "$0")/functions-ms.sh"
requires nbdsh --version
requires /usr/bin/python3 -c 'import nbd'
requires nbdkit sh --version

PY=/usr/bin/python3
M=1048576
# 32 MiB legs, regions of 1024 sectors (512 KiB): 64 regions.
leg0=$(mkfile leg0.img 32M)
leg1=$(mkfile leg1.img 32M)
log=$(mkfile log.img 4K)
# leg0: data in regions 0-3 and 40, holes elsewhere; leg1: stale data in
# region 50, where leg0 has a hole.
$PY - "$leg0" "$leg1" <<'EOF'
import random, sys
rng = random.Random(5)
R = 512 * 1024
with open(sys.argv[1], "r+b") as f:
    f.seek(0); f.write(rng.randbytes(4 * R))
    f.seek(40 * R); f.write(rng.randbytes(R))
with open(sys.argv[2], "r+b") as f:
    f.seek(50 * R); f.write(rng.randbytes(R))
EOF

# dirty LOG: the regions whose clean bit is 0 in the log (dm-log's
# format: bits from byte 1024), one line, after checking the header.
dirty ()
{
    $PY - "$1" <<'EOF'
import struct, sys
d = open(sys.argv[1], "rb").read()
magic, version, nr = struct.unpack_from("<IIQ", d, 0)
assert (magic, version) == (0x4D695272, 2), (hex(magic), version)
print(" ".join(str(r) for r in range(nr)
               if not d[1024 + r // 8] & (1 << (r % 8))))
EOF
}

table="0 65536 mirror disk 2 $log 1024 2 $leg0 0 $leg1 0"
uri="nbd+unix:///m?socket=$sock"
mkdir "$tmpdir/t"
start_server --stderr "$tmpdir/log1" ctl -f -v mapper tables="$tmpdir/t"

# 1. A new log (zeroes): all 64 regions out of sync and copied.
ms create m --table "$table"
grep -q "disk log $log: new log, 64/64 regions dirty" "$tmpdir/log1" ||
    die "no 'new log' line"
wait_for grep -q 'resync complete' "$tmpdir/log1" || die "no resync"
grep 'resync complete' "$tmpdir/log1"
grep -Eq 'resync complete, 64/64 regions in sync, 64 regions copied, [1-9][0-9]* bytes of holes skipped' \
     "$tmpdir/log1" || die "resync did not copy 64 regions skipping holes"
ms status m | grep -q " 64/64 1 AA 3 disk $log A\$" ||
    die "status: $(ms status m)"
ms table m | grep -q "mirror disk 2 $log 1024 2 $leg0 0 $leg1 0\$" ||
    die "table: $(ms table m)"
cmp "$leg0" "$leg1" || die "legs differ after the first resync"
du -k "$leg0" "$leg1"
[ "$(du -k "$leg1" | cut -f1)" -le $(( $(du -k "$leg0" | cut -f1) + 64 )) ] ||
    die "leg 1 is not sparse: $(du -k "$leg1")"
[ -z "$(dirty "$log")" ] || die "log not clean after resync: $(dirty "$log")"

# 2. Marked before the write is acknowledged, cleared by a flush.
nbdsh -u "$uri" -c "h.pwrite(b'x' * 4096, 20 * 512 * 1024 + 4096)"
[ "$(dirty "$log")" = 20 ] || die "after a write: dirty '$(dirty "$log")'"
# The first flush sees it in use (written since the last pass) and
# leaves it dirty; the next one, with no write in between, cleans it.
nbdsh -u "$uri" -c "h.flush()"
[ "$(dirty "$log")" = 20 ] || die "after a flush: dirty '$(dirty "$log")'"
nbdsh -u "$uri" -c "h.flush()"
[ -z "$(dirty "$log")" ] || die "after two flushes: dirty '$(dirty "$log")'"

# 3. kill -9 while a writer (no flushes) writes regions 8-15.
cat > "$tmpdir/writer.py" <<'EOF'
import nbd, random, sys
h = nbd.NBD()
h.connect_uri(sys.argv[1])
rng = random.Random(9)
while True:
    h.pwrite(rng.randbytes(65536), 4 * 1048576 + rng.randrange(64) * 65536)
EOF
$PY "$tmpdir/writer.py" "$uri" & writer=$!
cleanup_fn "kill_job $writer KILL"
marked () { [ -n "$(dirty "$log")" ]; }
wait_for marked || die "the writer marked nothing"
sleep 1
stop_server ctl KILL
kill -9 "$writer" 2>/dev/null || :
wait "$writer" 2>/dev/null || :
d=$(dirty "$log")
n=$(wc -w <<< "$d")
echo "dirty after kill -9: $n regions: $d"
for r in $d; do
    [ "$r" -ge 8 ] && [ "$r" -le 15 ] || die "region $r dirty, never written"
done
[ "$n" -ge 1 ] || die "nothing dirty"

start_server --stderr "$tmpdir/log2" ctl -f -v mapper tables="$tmpdir/t"
grep "disk log $log" "$tmpdir/log2"
grep -q "disk log $log: loaded, $n/64 regions dirty (to resync)" \
     "$tmpdir/log2" || die "the restart did not load $n dirty regions"
wait_for grep -q 'resync complete' "$tmpdir/log2" || die "no resync"
grep 'resync complete' "$tmpdir/log2"
grep -q "resync complete, 64/64 regions in sync, $n regions copied," \
     "$tmpdir/log2" || die "resync did not copy exactly the $n dirty regions"
cmp "$leg0" "$leg1" || die "legs differ after the crash's resync"
[ -z "$(dirty "$log")" ] || die "log not clean after resync: $(dirty "$log")"

# 4. A reload over the same log keeps it; another region size does not.
ms reload m --table "$table"
ms resume m
[ "$(grep -c "disk log $log: loaded, 0/64 regions dirty" "$tmpdir/log2")" = 1 ] ||
    die "the reload did not keep the log"
ms status m | grep -q " 64/64 1 AA 3 disk $log A\$" ||
    die "status after reload: $(ms status m)"
# A reload with another region size, not resumed, leaves the live
# table's log as it is (dm's disk_resume writes the header, not the
# constructor): header and bits unchanged, and dropped (clear), it
# changed nothing; the live table's marks still land in its layout.
hdr ()
{
    $PY - "$1" <<'EOF'
import struct, sys
d = open(sys.argv[1], "rb").read()
print(*struct.unpack_from("<IIQQ", d, 0))
EOF
}
h0=$(hdr "$log")
[ "$h0" = "$((0x4D695272)) 2 64 1024" ] || die "header: $h0"
ms reload m --table "0 65536 mirror disk 2 $log 2048 2 $leg0 0 $leg1 0"
[ "$(hdr "$log")" = "$h0" ] ||
    die "a reload not resumed rewrote the live table's log header: $(hdr "$log")"
nbdsh -u "$uri" -c "h.pwrite(b'z' * 4096, 30 * 512 * 1024)"
[ "$(dirty "$log")" = 30 ] || die "after the reload: dirty '$(dirty "$log")'"
ms clear m
[ "$(hdr "$log")" = "$h0" ] || die "a cleared table changed the log: $(hdr "$log")"
nbdsh -u "$uri" -c "h.flush(); h.flush()"
ms replace m --table "0 65536 mirror disk 2 $log 2048 2 $leg0 0 $leg1 0"
grep -q "log device $log was written for regions of 1024 sectors, now 2048: re-initialised" \
     "$tmpdir/log2" || die "no re-initialisation"
wait_for grep -q 'resync complete, 32/32 regions in sync, 32 regions copied' \
         "$tmpdir/log2" || die "the new region size did not resync everything"
cmp "$leg0" "$leg1" || die "legs differ"

# 5. Refused, naming the place and the device; nothing changes.
bad=$(mkfile bad.img 4K)
printf 'JUNK' | dd of="$bad" conv=notrunc status=none
cp "$bad" "$tmpdir/bad.orig"
fails "mirror: log device $bad: not a mirror log \(magic 0x4b4e554a in sector 0, expected 0x4d695272\)" \
      ms reload m --table "0 65536 mirror disk 2 $bad 1024 2 $leg0 0 $leg1 0"
cmp "$bad" "$tmpdir/bad.orig" || die "the refused table wrote the log"
small=$(mkfile small.img 1K)
fails "mirror: log device $small too small: 1024 bytes, a log of 64 regions needs 1536" \
      ms reload m --table "0 65536 mirror disk 2 $small 1024 2 $leg0 0 $leg1 0"
fails "mirror: log device: /nonexistent" \
      ms reload m --table "0 65536 mirror disk 2 /nonexistent 1024 2 $leg0 0 $leg1 0"
fails "invalid number of log arguments '1' \(2 to 4\)" \
      ms reload m --table "0 65536 mirror disk 1 1024 2 $leg0 0 $leg1 0"
ms table m | grep -q "mirror disk 2 $log 2048 2 " || die "table changed"
# A sync argument re-initialises whatever was there.
ms replace m --table "0 65536 mirror disk 3 $bad 1024 sync 2 $leg0 0 $leg1 0"
dirty "$bad" > /dev/null

# 6. The log cannot be read again at resume (its device fails after the
# reload's constructor read it): marks an older table made meanwhile are
# unknown, so every region resyncs; none is taken as clean.
a0=$(mkfile a0.img 32M); a1=$(mkfile a1.img 32M); alog=$(mkfile alog.img 4K)
ms create lg --table "0 8 linear $alog 0"
t6="0 65536 mirror disk 2 mapper:lg 1024 2 $a0 0 $a1 0"
ms create m6 --table "$t6"
synced6 () { [ "$(grep -c "device m6: resync complete, 64/64" "$tmpdir/log2")" -ge "$1" ]; }
wait_for synced6 1 || die "m6: no resync: $(ms status m6)"
ms reload m6 --table "$t6"
ms replace lg --table "0 8 error"
ms resume m6
grep -q "disk log mapper:lg: cannot read it again at resume (.*): every region resyncs" \
     "$tmpdir/log2" || die "m6: no message for the log that cannot be read"
wait_for synced6 2 || die "m6: regions taken as in sync: $(ms status m6)"
ms remove m6
ms remove lg

# 7. The log device fails (a remote log whose writes and flushes fail
# while $tmpdir/fail exists): the mark of a clean region fails (D; the
# write goes on, no block_on_error), which leaves the log device dirty;
# the client's next flush then fails on it, and status shows the log's
# F (dm-log's fail_log_device, F over D), as a leg's failed flush shows.
rl=$(mkfile rlog.img 4K)
file_sh "$tmpdir/rlog.sh" "$rl" "[ -e '$tmpdir/fail' ] && case \"\$1\" in pwrite|flush)
    echo \"EIO injected \$1 failure\" >&2; exit 1 ;;
esac"
start_server rlog sh "$tmpdir/rlog.sh"
rlog="nbd+unix:///?socket=$tmpdir/rlog.sock"
ms create m7 --table "0 65536 mirror disk 3 $rlog 1024 nosync 2 $a0 0 $a1 0"
ms status m7 | grep -q " 64/64 1 AA 3 disk .* A\$" || die "m7: status: $(ms status m7)"
u7="nbd+unix:///m7?socket=$sock"
nbdsh -u "$u7" -c "h.pwrite(b'x' * 4096, 4096); h.flush()"
[ "$(dirty "$rl")" = 0 ] || die "m7: region 0 not marked: '$(dirty "$rl")'"
touch "$tmpdir/fail"
nbdsh -u "$u7" -c '
import errno
h.pwrite(b"y" * 4096, 512 * 1024)    # region 1: its mark fails
try:
    h.flush()
    assert False, "a flush succeeded though the log device failed it"
except nbd.Error as e:
    assert e.errnum == errno.EIO, e
' || die "m7: the log's failed flush"
ms status m7 | grep -q " 64/64 1 AA 3 disk .* F\$" ||
    die "m7: the log's failed flush is not in the status: $(ms status m7)"
grep -q "device m7: log device .* failed a flush" "$tmpdir/log2" ||
    die "m7: no event for the log's failed flush"
rm "$tmpdir/fail"
ms remove m7
stop_server rlog

# 8. A clean stop leaves nothing to resync (dm's postsuspend disk_flush):
# regions written lately (in use at the last clear pass, or never passed
# since) are cleaned by a suspend, once their writes drained, and by a
# server stop; the restart loads the log with nothing dirty.
b0=$(mkfile b0.img 32M); b1=$(mkfile b1.img 32M); blog=$(mkfile blog.img 4K)
ms create m8 --table "0 65536 mirror disk 2 $blog 1024 2 $b0 0 $b1 0"
wait_for grep -q "device m8: resync complete" "$tmpdir/log2" || die "m8: no resync"
u8="nbd+unix:///m8?socket=$sock"
nbdsh -u "$u8" -c "h.pwrite(b'a' * 4096, 3 * 512 * 1024); h.flush()
h.pwrite(b'b' * 4096, 4 * 512 * 1024)"
[ "$(dirty "$blog")" = "3 4" ] || die "m8: after writes: dirty '$(dirty "$blog")'"
ms suspend m8
[ -z "$(dirty "$blog")" ] || die "m8: a suspend left regions dirty: $(dirty "$blog")"
ms resume m8
nbdsh -u "$u8" -c "h.pwrite(b'c' * 4096, 5 * 512 * 1024)"
[ "$(dirty "$blog")" = 5 ] || die "m8: after a write: dirty '$(dirty "$blog")'"
stop_server ctl
[ -z "$(dirty "$blog")" ] || die "m8: a clean stop left regions dirty: $(dirty "$blog")"
start_server --stderr "$tmpdir/log3" ctl -f -v mapper tables="$tmpdir/t"
grep -q "disk log $blog: loaded, 0/64 regions dirty" "$tmpdir/log3" ||
    die "m8: the restart has regions to resync: $(grep "disk log $blog" "$tmpdir/log3")"
ms remove m8
stop_server ctl
echo "$0: ok"
