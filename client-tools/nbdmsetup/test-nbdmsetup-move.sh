#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdmsetup move NAME DEST (pvmove): two-target devices moved from local
# files to a remote server (nbdkit file on a Unix socket, writes slowed
# by its delay filter so that the copy takes a while).  Bad input is
# refused and changes nothing; a move with writes during the copy ends
# on a linear table on DEST holding the targets laid out one after the
# other; SIGINT mid-copy leaves the mirror (usable), --resume finishes;
# kill -9 of the server mid-copy, a restart (tables=DIR) and the same
# command again finish; DEST failing writes mid-copy stops the move (the
# device carries on on the source), --resume copies again; the tool killed, then --abort, returns to the
# source table with the writes made meanwhile; a device left suspended
# in the last step (the tool killed there) is finished or aborted;
# progress is a line updated in place on a terminal, plain lines
# otherwise.  --log FILE (dm's disk log): kill -9 of the server mid-copy,
# restart, --resume with the same --log (another one refused).
# --method clone (dm-clone: reads of unhydrated regions from
# the source, writes to DEST only): interrupted, --abort refused (the
# source misses the writes), kill -9 of the server, --resume; DEST is the
# source plus the writes, and the source was never written.
source "$(dirname "$0")/functions-ms.sh"
requires nbdsh --version
requires nbdkit file --version
requires nbdkit --filter=delay null --version
requires cmp --version

half=$((8 << 20))                  # each target: 8 MiB of its own file
sectors=$((2 * half / 512))        # the device: 16 MiB
mkdir "$tmpdir/dst" "$tmpdir/tables"
for v in vol vint vkill vab vfin vfab vfail vcl vlog; do
    fill_random "$tmpdir/$v.a" $half 1$RANDOM
    fill_random "$tmpdir/$v.b" $half 2$RANDOM
    truncate -s $((2 * half)) "$tmpdir/dst/$v"
done
truncate -s 1M "$tmpdir/dst/small"
# The remote server: each file of dst/ an export; 10 ms per write.
start_server dst --filter=delay file dir="$tmpdir/dst" wdelay=10ms
# And one whose writes fail with EIO while $tmpdir/fail exists.
start_server dfail --filter=error --filter=delay file "$tmpdir/dst/vfail" \
             wdelay=10ms error-pwrite=EIO error-pwrite-rate=1 \
             error-pwrite-file="$tmpdir/fail"
furl="nbd+unix:///?socket=$tmpdir/dfail.sock"
dsock=$tmpdir/dst.sock
durl () { echo "nbd+unix:///$1?socket=$dsock"; }
start_server --stderr "$tmpdir/log" ctl mapper tables="$tmpdir/tables"

srctable () { printf '0 %d linear %s 0\n%d %d linear %s 0\n' \
                     $((sectors / 2)) "$tmpdir/$1.a" $((sectors / 2)) \
                     $((sectors / 2)) "$tmpdir/$1.b"; }
for v in vol vint vkill vab vfin vfab vfail; do
    ms create $v --table "$(srctable $v)"
done
# Regions of 32 KiB: 512 of them, 5 s or so of copying at 10 ms each.
rs=64

# unchanged NAME BEFORE: NAME's table and event number are BEFORE's.
snap () { ms table "$1"; ev "$1"; ms info "$1" | grep '^State'; }
unchanged () { [ "$(snap "$1")" = "$2" ] || die "$1 changed: $(snap "$1")"; }

# partial NAME: until NAME's mirror is part way (some regions in sync,
# not all); fails if the copy ended first.
progress () { ms status "$1" |
              awk '$3 == "mirror" || $3 == "clone" {
                       split($7, a, "/"); s += a[1]; t += a[2] }
                   END { print s + 0, t + 0 }'; }
partial ()
{
    local s t i
    for (( i = 0; i < 600; i++ )); do
        read -r s t < <(progress "$1")
        if [ "$t" -gt 0 ] && [ "$s" -gt 0 ]; then
            [ "$s" -lt "$t" ] || die "$1: the copy ended before the test could stop it"
            return 0
        fi
        sleep 0.05
    done
    die "$1: no copy under way: $(ms status "$1")"
}
# moved NAME: NAME is one linear line on its DEST, which holds the
# device: the first target then the second (every write went to both
# legs, so the sources hold the client's writes too).
moved ()
{
    [ "$(ms table "$1")" = "0 $sectors linear ${2:-$(durl "$1")} 0" ] ||
        die "$1: table after the move: $(ms table "$1")"
    cmp -n $half "$tmpdir/$1.a" "$tmpdir/dst/$1" || die "$1: first target"
    cmp -n $half -i 0:$half "$tmpdir/$1.b" "$tmpdir/dst/$1" ||
        die "$1: second target"
}
# write_mark NAME BYTE: writes (and flushes) 64 KiB of BYTE in each
# target of NAME; marked NAME BYTE checks them.
write_mark () { nbdsh -u "nbd+unix:///$1?socket=$sock" -c "
h.pwrite(bytes([$2]) * 65536, 1 << 20)
h.pwrite(bytes([$2]) * 65536, $half + (3 << 20) + 512)
h.flush()"; }
marked () { nbdsh -u "nbd+unix:///$1?socket=$sock" -c "
assert h.pread(65536, 1 << 20) == bytes([$2]) * 65536
assert h.pread(65536, $half + (3 << 20) + 512) == bytes([$2]) * 65536" ||
    die "$1: the writes of $2 are not there"; }
# bg_move NAME [ARG...]: nbdmsetup move --region-size $rs NAME ARG... in
# the background, output in $tmpdir/NAME.out, $mv its pid (nbdmsetup
# itself, not a subshell running the ms function: the process the test
# signals).  WRAP=with_sigint: with SIGINT as in a terminal.
bg_move () { local n=$1; shift
             ${WRAP:-} "$NBDMSETUP" move --region-size $rs "$n" "$@" \
                 > "$tmpdir/$n.out" 2>&1 & mv=$!; }
# stopped NAME WHY PATTERN: the background move exits 1 (shown), with a
# message matching PATTERN.
stopped () { local rc=0; wait $mv || rc=$?
             cat "$tmpdir/$1.out"
             [ $rc -eq 1 ] || die "move $1 ($2): exit $rc, not 1"
             grep -q -- "$3" "$tmpdir/$1.out" || die "move $1 ($2): no /$3/"; }
mirror_live () { ms table "$1" | grep -q " mirror core 2 $rs sync 2 " ||
                     die "$1: not on the move's mirror: $(ms table "$1")"; }

# --- bad input: refused, nothing changed -----------------------------------
before=$(snap vol)
fails "move nosuch: info: no such device" ms move nosuch "$(durl vol)"
fails "DEST missing" ms move vol
fails "give one of them" ms move --resume --abort vol
fails "NAME only" ms move --abort vol "$(durl vol)"
fails "not being moved" ms move --abort vol
fails "not being moved" ms move --resume vol
fails "region-size: '3' is not a power of two" ms move --region-size 3 vol "$(durl vol)"
fails "a disk log serves one mirror, and the table has 2 targets" ms move --log "$tmpdir/log.img" vol "$(durl vol)"
fails "method: 'copy' is neither mirror nor clone" ms move --method copy vol "$(durl vol)"
fails "metadata: for --method clone" ms move --metadata "$tmpdir/vcl.md" vol "$(durl vol)"
fails "log: for --method mirror" ms move --method clone --log core vol "$(durl vol)"
fails "clone vol: dm-clone copies whole devices .* not 2 lines" \
      ms move --method clone --metadata "$tmpdir/vcl.md" vol "$(durl vol)"
fails "--resume is an option of move" ms info --resume vol
# DEST too small, DEST unreachable: the server refuses the mirror.
fails "move vol: replace: .*(leg 1|small).*nothing changed" \
      ms move vol "$(durl small)"
unchanged vol "$before"
fails "move vol: replace: .*leg 1.*nothing changed" \
      ms move vol "nbd+unix:///x?socket=$tmpdir/nobody.sock"
unchanged vol "$before"
# DEST holding another line's source: its mirror would copy over it.
truncate -s $((2 * half)) "$tmpdir/self.img"
ms create vself --table "0 $((sectors / 2)) linear $tmpdir/vol.a 0
$((sectors / 2)) $((sectors / 2)) linear $tmpdir/self.img 0"
self_before=$(snap vself)
fails "move vself: line 2 is on $tmpdir/self.img already" \
      ms move vself "$tmpdir/self.img"
unchanged vself "$self_before"
ms remove vself
# A target with no one area to copy.
ms create z --table "0 2048 zero"
fails "move z: line 1 \(0 2048 zero\): a zero target has no one source area" \
      ms move z "$(durl small)"
# Suspended, or with a table in the inactive slot (the move's last step
# uses it).
ms suspend vol
fails "suspended: resume it first" ms move vol "$(durl vol)"
ms resume vol
ms load vol --table "0 $sectors zero"
fails "inactive table" ms move vol "$(durl vol)"
ms clear vol
unchanged vol "$before"
echo "bad input: refused, nothing changed"

# --- a move with writes during the copy ------------------------------------
bg_move vol "$(durl vol)"
partial vol
write_mark vol 171
wait $mv || { cat "$tmpdir/vol.out"; die "move vol failed"; }
cat "$tmpdir/vol.out"
grep -q "^move vol: done: vol is on $(durl vol)" "$tmpdir/vol.out" ||
    die "move vol: no 'done' line"
# Not a terminal: plain lines, no carriage return.
[ "$(grep -c 'regions in sync' "$tmpdir/vol.out")" -ge 2 ] ||
    die "move vol: fewer than 2 progress lines"
! grep -q $'\r' "$tmpdir/vol.out" || die "move vol: \\r in a non-tty output"
moved vol
marked vol 171
# Again: nothing to do.
ms move vol "$(durl vol)" | grep -q "already" || die "move vol again"
echo "move vol: ok"

# --- SIGINT mid-copy, then --resume ----------------------------------------
# A background job of a script starts with SIGINT ignored (which
# nbdmsetup respects, as any program): this one gets the default back,
# as a command in a terminal has it, for Ctrl-C.
with_sigint () { exec python3 -c 'import os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_DFL)
os.execvp(sys.argv[1], sys.argv[1:])' "$@"; }
WRAP=with_sigint bg_move vint "$(durl vint)"
partial vint
kill -INT $mv
stopped vint SIGINT "interrupted.*move --resume vint.*move --abort vint"
mirror_live vint
[ "$(ms info vint | sed -n 's/^State: *//p')" = ACTIVE ] || die "vint suspended"
write_mark vint 172                    # usable throughout
marked vint 172
ms move --resume vint > "$tmpdir/vint.out" 2>&1 ||
    { cat "$tmpdir/vint.out"; die "move --resume vint"; }
moved vint
marked vint 172
echo "move vint (SIGINT, --resume): ok"

# --- kill -9 of the server mid-copy, restart, the same command -------------
bg_move vkill "$(durl vkill)"
partial vkill
write_mark vkill 173
stop_server ctl KILL
stopped vkill "server killed" "move --resume vkill"
start_server --stderr "$tmpdir/log2" ctl mapper tables="$tmpdir/tables"
mirror_live vkill
marked vkill 173
ms move --region-size $rs vkill "$(durl vkill)" > "$tmpdir/vkill.out" 2>&1 ||
    { cat "$tmpdir/vkill.out"; die "move vkill again"; }
moved vkill
marked vkill 173
echo "move vkill (server kill -9, restart, again): ok"

# --- DEST fails writes mid-copy: the move stops, --resume copies again -----
bg_move vfail "$furl"
partial vfail
touch "$tmpdir/fail"
stopped vfail "DEST failing" "move vfail: DEST failed .* (leg 1, '[DS]', line [12]): the move cannot finish (vfail stays on the mirror, whose copy to DEST has stopped: once DEST works, 'nbdmsetup move --resume' copies it all again"
mirror_live vfail
write_mark vfail 176                   # on the source alone, without error
marked vfail 176
rm "$tmpdir/fail"
ms move --resume vfail > "$tmpdir/vfail.out" 2>&1 ||
    { cat "$tmpdir/vfail.out"; die "move --resume vfail"; }
grep -q "copying again from the start" "$tmpdir/vfail.out" ||
    { cat "$tmpdir/vfail.out"; die "move --resume vfail: no fresh mirror"; }
moved vfail "$furl"
marked vfail 176
echo "move vfail (DEST failing, --resume): ok"

# --- the tool killed mid-copy, then --abort --------------------------------
bg_move vab "$(durl vab)"
partial vab
kill -KILL $mv; wait $mv 2>/dev/null || :
mirror_live vab
write_mark vab 174
ms move --abort vab | grep -q "aborted" || die "move --abort vab"
[ "$(ms table vab)" = "$(srctable vab)" ] ||
    die "vab after --abort: $(ms table vab)"
marked vab 174
cmp -n 65536 -i $((1 << 20)):0 "$tmpdir/vab.a" <(head -c 65536 /dev/zero | tr '\0' '\256') ||
    die "vab: the source misses the write made during the move"
echo "move --abort vab: ok"

# --- killed in the last step: suspended, the linear table loaded ----------
for v in vfin vfab; do
    bg_move $v "$(durl $v)"
    partial $v
    kill -KILL $mv; wait $mv 2>/dev/null || :
    ms load $v --table "0 $sectors linear $(durl $v) 0"
    ms suspend $v
done
# The copy is not over: the check fails, the mirror goes on, then ends.
ms move --resume vfin > "$tmpdir/vfin.out" 2>&1 ||
    { cat "$tmpdir/vfin.out"; die "move --resume vfin (suspended)"; }
moved vfin
[ "$(ms info vfin | sed -n 's/^State: *//p')" = ACTIVE ] || die "vfin suspended"
ms move --abort vfab | grep -q aborted || die "move --abort vfab (suspended)"
[ "$(ms table vfab)" = "$(srctable vfab)" ] || die "vfab: $(ms table vfab)"
[ "$(ms info vfab | sed -n 's/^State: *//p')" = ACTIVE ] || die "vfab suspended"
[ -z "$(ms table --inactive vfab)" ] || die "vfab: an inactive table left"
echo "killed in the last step: ok"

# --- a terminal: the progress line is updated in place ---------------------
if script --version >/dev/null 2>&1; then
    ms move --abort vfab >/dev/null 2>&1 || :
    NBDMSETUP=$NBDMSETUP script -qec \
        "\"\$NBDMSETUP\" move --region-size $rs vfab '$(durl vfab)'" \
        /dev/null > "$tmpdir/tty.out" < /dev/null ||
        { cat "$tmpdir/tty.out"; die "move vfab on a terminal"; }
    grep -q $'\rmove vfab: [0-9]*/[0-9]* regions in sync' "$tmpdir/tty.out" ||
        { od -c "$tmpdir/tty.out" | head; die "no progress line with \\r"; }
    moved vfab
    echo "terminal progress: ok"
fi
# --- --log FILE: dm's disk log ------------------------------------------------
fill_random "$tmpdir/vlog.a" $((2 * half)) 3$RANDOM
truncate -s 1M "$tmpdir/vlog.log"
ms create vlog --table "0 $sectors linear $tmpdir/vlog.a 0"
bg_move vlog "$(durl vlog)" --log "$tmpdir/vlog.log"
partial vlog
nbdsh -u "nbd+unix:///vlog?socket=$sock" -c "
h.pwrite(bytes([177]) * 65536, 5 << 20)
h.flush()"
# The table that runs (and is saved) loads the log as it is: with "sync"
# it would start the log anew at every load, and the copy from zero.
ms table vlog | grep -q " mirror disk 2 $tmpdir/vlog.log $rs 2 " ||
    die "vlog: not on the disk log's mirror without sync: $(ms table vlog)"
# Regions the log has as in sync (clean bits from byte 1024), once some.
logged () { python3 -c '
import sys
b = open(sys.argv[1], "rb").read()[1024:]
print(sum(bin(x).count("1") for x in b))' "$tmpdir/vlog.log"; }
for (( i = 0; i < 300; i++ )); do
    [ "$(logged)" -gt 0 ] && break
    sleep 0.1
done
[ "$(logged)" -gt 0 ] || die "vlog: no region in sync on the log"
stop_server ctl KILL
stopped vlog "server killed" "after a restart, where its disk log says.*move --resume vlog"
start_server --stderr "$tmpdir/log4" ctl mapper tables="$tmpdir/tables"
ms table vlog | grep -q " mirror disk 2 $tmpdir/vlog.log $rs 2 " ||
    die "vlog: not on the disk log's mirror: $(ms table vlog)"
read -r s t < <(progress vlog)
echo "after the restart: $s/$t regions in sync"
[ "$s" -gt 0 ] || die "vlog: the restart copies from zero (the log had $(logged) regions in sync)"
fails "vlog: the move under way has the log 'disk 2 $tmpdir/vlog.log $rs' on line 1, not 'core 2 $rs sync'" \
      ms move --resume --log core --region-size $rs vlog
ms move --resume --log "$tmpdir/vlog.log" --region-size $rs vlog \
   > "$tmpdir/vlog.out" 2>&1 || { cat "$tmpdir/vlog.out"; die "move --resume vlog"; }
[ "$(ms table vlog)" = "0 $sectors linear $(durl vlog) 0" ] ||
    die "vlog after the move: $(ms table vlog)"
cmp "$tmpdir/vlog.a" "$tmpdir/dst/vlog" || die "vlog: DEST differs from the source"
nbdsh -u "nbd+unix:///vlog?socket=$sock" -c "
assert h.pread(65536, 5 << 20) == bytes([177]) * 65536" || die "vlog: the write"
echo "move --log FILE vlog: ok"

# --- --method clone -----------------------------------------------------------
truncate -s 4M "$tmpdir/vcl.md"
cp "$tmpdir/vcl.a" "$tmpdir/vcl.orig"
ms create vcl --table "0 $((half / 512)) linear $tmpdir/vcl.a 0"
fails "clone vcl: --metadata FILE is missing" ms move --method clone vcl "$(durl vcl)"
WRAP=with_sigint bg_move vcl "$(durl vcl)" --method clone \
    --metadata "$tmpdir/vcl.md"
partial vcl
clmark () { nbdsh -u "nbd+unix:///vcl?socket=$sock" -c "
h.pwrite(bytes([$1]) * 65536, 1 << 20)
h.pwrite(bytes([$1]) * 4096, (6 << 20) + 512)
h.flush()"; }
clmark 175
kill -INT $mv
stopped vcl SIGINT "interrupted.*stays on the clone.*move --resume vcl"
before=$(snap vcl)
fails "abort vcl: a clone move writes to DEST only" ms move --abort vcl
unchanged vcl "$before"
fails "the move under way is a clone, not a mirror" \
      ms move --method mirror vcl "$(durl vcl)"
stop_server ctl KILL
start_server --stderr "$tmpdir/log3" ctl mapper tables="$tmpdir/tables"
ms move --resume vcl > "$tmpdir/vcl.out" 2>&1 ||
    { cat "$tmpdir/vcl.out"; die "move --resume vcl"; }
grep -q "regions hydrated" "$tmpdir/vcl.out" || die "vcl: no progress line"
[ "$(ms table vcl)" = "0 $((half / 512)) linear $(durl vcl) 0" ] ||
    die "vcl after the move: $(ms table vcl)"
cmp "$tmpdir/vcl.a" "$tmpdir/vcl.orig" || die "vcl: the clone wrote its source"
# DEST: the source, with the writes.
python3 - "$tmpdir/vcl.orig" "$tmpdir/dst/vcl" <<'PYEOF' || die "vcl: DEST"
import sys
src = bytearray(open(sys.argv[1], "rb").read())
src[1 << 20:(1 << 20) + 65536] = bytes([175]) * 65536
src[(6 << 20) + 512:(6 << 20) + 512 + 4096] = bytes([175]) * 4096
dst = open(sys.argv[2], "rb").read()[:len(src)]
assert dst == bytes(src), "DEST is not the source plus the writes"
PYEOF
echo "move --method clone vcl: ok"
echo "$0: ok"
