#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# A held request never holds the server up.  SIGTERM while a read waits
# on a suspended device, or in a 10-minute delay, or while "nbdmsetup
# wait" waits for an event that never comes: the server exits (stopping
# it fails the test if it had to be killed with SIGKILL) and the held read
# fails with ESHUTDOWN.  A client that goes away while its read is held
# frees the worker: its connection closes (open count 0) and the device
# serves on.  The control export answers while a read is held.  A
# mirror's resync held by a suspended device holds up neither a stop nor
# a suspend of the mirror.
source "$(dirname "$0")/functions-ms.sh"
requires nbdsh --version

a=$(mkfile a.img 1M)
a=$(realpath "$a")
uri="nbd+unix:///dev?socket=$sock"

# serve TABLE: the server with a device dev of TABLE, its debug log in
# $tmpdir/log (nbdkit logs each request as it enters the plugin).
serve ()
{
    echo "$1" > "$tmpdir/dev.table"
    start_server --stderr "$tmpdir/log" ctl -v mapper "$tmpdir/dev.table"
}

# held_read [NAME]: a read of NAME (dev) in the background ($reader, which
# reports in $tmpdir/reader.out), once it has reached the plugin; the
# control export still answers, and counts the reader's connection.
held_read ()
{
    local name=${1:-dev}
    nbdsh -u "nbd+unix:///$name?socket=$sock" -c '
try:
    h.pread(512, 0)
    print("read completed")
except nbd.Error as e:
    print("read failed:", e.errno)
' > "$tmpdir/reader.out" 2>&1 &
    reader=$!
    wait_for grep -q 'mapper: pread count=512 offset=0' "$tmpdir/log" ||
        die "the read did not reach the plugin"
    ms info "$name" | grep -q '^Open count: *1$' ||
        die "control export: $(ms info "$name")"
}

# stop_held WHAT: SIGTERM the server; it must exit by itself, and the
# held read fail with ESHUTDOWN.
stop_held ()
{
    stop_server ctl || die "$1: the server needed SIGKILL"
    wait "$reader" || :
    grep -q '^read failed: ESHUTDOWN$' "$tmpdir/reader.out" ||
        die "$1: the held read: $(cat "$tmpdir/reader.out")"
    echo "$1: the server stopped; the held read failed with ESHUTDOWN"
}

# open_count_is NAME N
open_count_is () { ms info "$1" | grep -q "^Open count: *$2\$"; }

# 1. A read held by a suspended device, then SIGTERM.
serve "0 2048 linear $a 0"
ms suspend dev
held_read
ms info dev | grep -q '^State: *SUSPENDED$' || die "not suspended"
stop_held "suspended device"

# 2. A read held by a 10-minute delay, then SIGTERM.
serve "0 2048 delay $a 0 600000"
held_read
ms status dev | grep -qx '0 2048 delay 1 0 0' || die "not delayed: $(ms status dev)"
stop_held "delay"

# 3. The client goes away while its read is held by a suspended device:
# the request is given up, the connection closes, and the device is still
# there to resume (and to remove: nothing holds it open).
serve "0 2048 linear $a 0"
ms suspend dev
held_read
kill -9 "$reader"
wait "$reader" 2>/dev/null || :
wait_for open_count_is dev 0 || die "disconnected: $(ms info dev)"
ms resume dev
nbdsh -u "$uri" -c 'assert h.pread(512, 0) == bytes(512)' ||
    die "read after resume"
# That reader's connection closes a little after it exits.
wait_for open_count_is dev 0 || die "after the read: $(ms info dev)"
ms remove dev
echo "suspended device: a gone client's held read was given up"
stop_server ctl || die "after a disconnect: the server needed SIGKILL"

# ... and by a delay: it no longer shows as delayed.
serve "0 2048 delay $a 0 600000"
held_read
kill -9 "$reader"
wait "$reader" 2>/dev/null || :
wait_for open_count_is dev 0 || die "disconnected: $(ms info dev)"
ms status dev | grep -qx '0 2048 delay 0 0 0' || die "status: $(ms status dev)"
echo "delay: a gone client's held read was given up"
stop_server ctl || die "after a disconnect: the server needed SIGKILL"

# ... and through a mirror whose leg is a suspended device (mapper:dev):
# the read given up is no fault of the leg's (still A, not R).
b=$(mkfile b.img 1M)
serve "0 2048 linear $a 0"
ms create up --table "0 2048 mirror core 2 1024 nosync 2 mapper:dev 0 $b 0"
ms suspend dev
held_read up
kill -9 "$reader"
wait "$reader" 2>/dev/null || :
wait_for open_count_is up 0 || die "disconnected: $(ms info up)"
ms status up | grep -q ' 1 AA 1 core$' || die "the leg was blamed: $(ms status up)"
ms resume dev
nbdsh -u "nbd+unix:///up?socket=$sock" -c 'assert h.pread(512, 0) == bytes(512)' ||
    die "mirror read after resume"
echo "mirror: a gone client's read held by a suspended leg was given up"
stop_server ctl || die "after a disconnect: the server needed SIGKILL"

# 4. "nbdmsetup wait" with no timeout for an event that never comes, then
# SIGTERM: the wait fails, the server exits.
serve "0 2048 linear $a 0"
ms wait dev > "$tmpdir/wait.out" 2>&1 &
waiter=$!
wait_for grep -q 'control: wait' "$tmpdir/log" || die "no wait"
stop_server ctl || die "event wait: the server needed SIGKILL"
rc=0
wait "$waiter" || rc=$?
[ "$rc" -ne 0 ] || die "the wait succeeded: $(cat "$tmpdir/wait.out")"
echo "event wait: the server stopped; the wait failed: $(cat "$tmpdir/wait.out")"

# 5. A mirror whose resync reads a suspended device (mapper:dev): the
# resync thread, the engine's own, waits in that device's gate; SIGTERM
# and the server exits (its cleanup joins the thread), without blaming
# the leg.
serve "0 2048 linear $a 0"
ms suspend dev
ms create up --table "0 2048 mirror core 2 1024 sync 2 mapper:dev 0 $b 0"
ms status up | grep -q ' 0/2 1 AA 1 core$' || die "resync: $(ms status up)"
stop_server ctl || die "resync from a suspended device: the server needed SIGKILL"
! grep 'failed a resync' "$tmpdir/log" || die "the leg was blamed"
echo "resync from a suspended device: the server stopped"

# 6. Suspending that mirror meanwhile: the copy held by the suspended
# device gives up, so the suspend returns and the control export answers
# (the device's resume among the rest); after both resumes the resync
# finishes.  ("timeout" turns a hang into a failure.)
serve "0 2048 linear $a 0"
ms suspend dev
ms create up --table "0 2048 mirror core 2 1024 sync 2 mapper:dev 0 $b 0"
timeout 60 "$NBDMSETUP" suspend up || die "suspend of the mirror hung"
ms info up | grep -q '^State: *SUSPENDED$' || die "mirror: $(ms info up)"
ms resume dev
ms resume up
resynced () { ms status up | grep -q ' 2/2 1 AA 1 core$'; }
wait_for resynced || die "resync after resume: $(ms status up)"
echo "suspending a mirror whose resync a suspended device holds: done"
stop_server ctl || die "mirror suspend: the server needed SIGKILL"

echo "$0: ok"
