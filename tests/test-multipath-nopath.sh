#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# A multipath device with every path down: its two servers (nbdkit over
# one file) killed with SIGKILL, remote-timeout 600 s.
#
#  1. Without queue_if_no_path: a read fails with EIO (after the path
#     timeout of each path, not remote-timeout), and works again once a
#     server is back and the checker has reinstated its path.
#  2. With queue_if_no_path (the message): a read waits (status says I/O
#     is queued) and completes with the right data when a server comes
#     back; a suspend fails the queued read rather than waiting for it
#     (dm's presuspend), a noflush suspend keeps it queued across (the
#     suspend completes, the read completes after the resume once a path
#     is back); fail_if_no_path fails a queued read.
#  3. no_path_retry 3: a queued read fails once there has been no path
#     for 3 checker intervals, with a logged event.
#  4. Shutdown never hangs on a queued read: SIGTERM with a read queued
#     stops the server (stop_server fails the test after 10 s).
source "${top_srcdir:-$(dirname "$0")/..}/tests/functions-mpath.sh"

requires nbdkit --version
requires python3 -c 'import nbd'
requires timeout --version

two_paths 9

echo "0 8192 multipath 2 checker_interval_msecs 200 0 1 1 round-robin 0 2 0 $A $B" \
    > "$tmpdir/m.table"
start_mapper "$tmpdir/m.table" remote-timeout=600

# --- 1. no queueing: EIO ------------------------------------------------
read_check ok
both_down
read_check EIO || die "case 1: a read with no path did not fail with EIO"
path_is "$A" F && path_is "$B" F || die "case 1: status: $(ms status m)"
both_up
read_check ok || die "case 1: no read after the paths came back"

# --- 2. queue_if_no_path ------------------------------------------------
ms message m 0 queue_if_no_path
both_down
read_bg ok
queued
kit a "$disk"
read_wait "case 2: the queued read failed once a path came back"
kit b "$disk"; wait_path "$B" A
# A suspend fails what is queued.
both_down
read_bg EIO
queued
ms suspend m
read_wait "case 2: the queued read did not fail at suspend"
ms resume m
# A noflush suspend keeps it queued (dm's multipath_presuspend): the
# suspend completes (the read waits at the gate, not in flight), the
# read waits across it, queued again once resumed, and completes once a
# path is back.
read_bg ok
queued
ms suspend --noflush m
kill -0 "$rd" 2>/dev/null ||
    { cat "$tmpdir/rd.out"; die "case 2: the queued read failed at a noflush suspend"; }
ms info m | grep -qi 'suspended' || die "case 2: not suspended: $(ms info m)"
ms resume m
queued
kit a "$disk"
read_wait "case 2: the read queued across a noflush suspend did not complete"
kit b "$disk"; wait_path "$A" A; wait_path "$B" A
both_down
# fail_if_no_path fails what is queued.
read_bg EIO
queued
ms message m 0 fail_if_no_path
read_wait "case 2: fail_if_no_path did not fail the queued read"
logged 'multipath: device m: fail_if_no_path: failing I/O when no path is left'
stop_server ctl
both_up() { kit a "$disk"; kit b "$disk"; }
both_up

# --- 3. no_path_retry 3 ---------------------------------------------------
echo "0 8192 multipath 4 no_path_retry 3 checker_interval_msecs 200 0 1 1 round-robin 0 2 0 $A $B" \
    > "$tmpdir/m.table"
start_mapper "$tmpdir/m.table" remote-timeout=600
read_check ok
both_down
read_check EIO || die "case 3: a queued read did not fail after no_path_retry"
logged 'multipath: device m: no path for 3 checker intervals \(no_path_retry\): failing queued I/O'
# A path back: queueing again.
both_up
wait_path "$A" A
read_check ok
stop_server ctl

# --- 4. shutdown with a queued read ----------------------------------------
echo "0 8192 multipath 1 queue_if_no_path 0 1 1 round-robin 0 2 0 $A $B" \
    > "$tmpdir/m.table"
start_mapper "$tmpdir/m.table" remote-timeout=600
read_check ok
both_down
read_bg gone
queued
stop_server ctl || die "case 4: the server hung at shutdown with a queued read"
read_wait "case 4: the queued read did not end at shutdown"
echo "$0: ok"
