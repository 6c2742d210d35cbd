#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Events an administrator waits for, as dm raises them for dmeventd: a
# mirror's resync completing and a mirror leg failing move the device's
# event number, so "nbdmsetup wait NAME EVENT_NR" returns, and each is
# logged at nbdkit's default verbosity (no -v).  A table replaced while
# its resync runs raises nothing on the device once it is gone; the new
# table's completion does.
source "$(dirname "$0")/functions-ms.sh"
requires nbdsh --version

# waits NAME EVENT_NR: nbdmsetup wait must return (not time out) with a
# number above EVENT_NR.
waits ()
{
    local out
    out=$(ms --json wait "$1" "$2" --timeout 30) ||
        die "wait $1 $2 timed out: no event (now $(ev "$1"))"
    [[ $out =~ \"event_nr\":\ ([0-9]+) ]] || die "wait $1: output '$out'"
    [ "${BASH_REMATCH[1]}" -gt "$2" ] || die "wait $1 $2 returned $out"
}
# logged PATTERN: the server's log has a line matching PATTERN (grep -E)
# at the default verbosity (the server runs without -v, so only what
# nbdkit prints to everyone is there).
logged ()
{
    grep -E -- "$1" "$tmpdir/log" ||
        { cat "$tmpdir/log"; die "log has no line matching /$1/"; }
}

# 4 MiB legs, regions of 256 sectors: 32 regions.  Leg 0 is a delay
# device (reads wait 20 ms), so resync takes a while: the wait below
# starts while it is still running (not asserted: that would be timing).
a=$(mkfile a.img 4M)
fill_random "$a" 4194304 7
b=$(mkfile b.img 4M)
b2=$(mkfile b2.img 4M)
c=$(mkfile c.img 1M)
d=$(mkfile d.img 1M)

# In the foreground, stderr to a file: a daemonised nbdkit logs to
# syslog.
mkdir "$tmpdir/t"
start_server --stderr "$tmpdir/log" ctl -f mapper tables="$tmpdir/t"

# 1. Resync complete.  Create, load and resume: event 1; resync done: 2.
ms create slow --table "0 8192 delay $a 0 20"
ms create m --table "0 8192 mirror core 2 256 sync 2 mapper:slow 0 $b 0"
[ "$(ev m)" = 1 ] || die "event number after create is $(ev m), not 1"
echo "while resyncing: $(ms status m)"
waits m 1
ms status m | grep -q ' 32/32 1 AA 1 core$' ||
    die "wait returned before resync was complete: $(ms status m)"
cmp "$a" "$b" || die "leg 1 differs from leg 0 after resync"
logged '^nbdkit: .*mirror: device m: resync complete, 32/32 regions in sync, 32 regions copied, [0-9]+ bytes of holes skipped$'
[ "$(ev m)" = 2 ] || die "event number after resync is $(ev m), not 2"

# 2. The table is replaced over and over while it resyncs (one batch:
# each replace stops the previous table's resync and drops it): no
# crash, and the dropped tables raise nothing on m; the last one's
# completion is one event.
for i in 1 2 3 4 5 6; do
    leg=$b2; [ $((i % 2)) = 0 ] && leg=$b
    echo "replace m --table '0 8192 mirror core 2 256 sync 2 mapper:slow 0 $leg 0'"
done | ms batch
# Wait for the last table's resync through its event: e is read before
# the status, so a completion after it moves the number past e, and a
# completion before it shows in the status.
while :; do
    e=$(ev m)
    ms status m | grep -q ' 32/32 1 AA 1 core$' && break
    waits m "$e"
done
cmp "$a" "$b" || die "leg 1 differs from leg 0 after the last resync"
e=$(ev m)
sleep 0.5                               # a stray event would come now
[ "$(ev m)" = "$e" ] || die "event number moved from $e to $(ev m) after resync"

# 3. A leg fails a write.  Leg 1 is a stacked device replaced by an error
# table; with handle_errors the write succeeds on leg 0, the leg turns D
# and the device raises one event (the second write, to a leg already
# left out, none).
ms create bad --table "0 2048 linear $d 0"
ms create m2 --table "0 2048 mirror core 2 256 nosync 2 $c 0 mapper:bad 0 1 handle_errors"
ms replace bad --table "0 2048 error"
[ "$(ev m2)" = 1 ] || die "event number of m2 is $(ev m2), not 1"
nbdsh -u "nbd+unix:///m2?socket=$sock" -c '
h.pwrite(b"W" * 4096, 0)
h.pwrite(b"X" * 4096, 4096)
'
waits m2 1
ms status m2 | grep -q ' 1 AD 1 core$' ||
    die "status after the leg failed: $(ms status m2)"
logged '^nbdkit: .*mirror: device m2: leg 1 mapper:bad failed a write$'
[ "$(ev m2)" = 2 ] || die "event number of m2 is $(ev m2), not 2"

# Nothing of this is debug output.
if grep -q 'debug:' "$tmpdir/log"; then die "debug output without -v"; fi
echo "--- the server log:"; cat "$tmpdir/log"
echo "$0: ok"
