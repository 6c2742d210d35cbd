#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# queue_if_no_path and fail_if_no_path messages, with the device's table
# kept in tables=DIR: what `nbdmsetup table` prints, what is saved and
# what a restart runs agree (two nbdkit servers over one file, killed
# with SIGKILL for "no path").
#
#  1. Without no_path_retry the message is the table's feature (dm's
#     flag): printed, saved, and a restart queues as before it.
#  2. With no_path_retry 3 (multipathd's queue mode), fail_if_no_path
#     holds until a path comes back: a read with no path fails at once;
#     the table keeps no_path_retry 3, printed and saved alike, and a
#     restart queues for 3 checker intervals, then fails.
source "${top_srcdir:-$(dirname "$0")/..}/tests/functions-mpath.sh"

requires nbdkit --version
requires python3 -c 'import nbd'
requires timeout --version

two_paths 5
dir=$tmpdir/tables
mkdir "$dir"
restart ()
{
    stop_server ctl
    start_server --stderr "$tmpdir/log" ctl -f mapper tables="$dir" \
        remote-timeout=600
}
# agree TABLE: nbdmsetup table prints TABLE, and it is what is saved.
agree ()
{
    local t
    t=$(ms table m)
    [ "$t" = "$1" ] || die "table: '$t', expected '$1'"
    [ "$(cat "$dir/m.table")" = "$1" ] ||
        die "saved: '$(cat "$dir/m.table")', expected '$1'"
}
paths="0 1 1 round-robin 0 2 1 $A 1 $B 1"

# --- 1. no no_path_retry: the message is the table's ------------------------
echo "0 8192 multipath 2 checker_interval_msecs 200 $paths" > "$dir/m.table"
start_server --stderr "$tmpdir/log" ctl -f mapper tables="$dir" remote-timeout=600
ms message m 0 queue_if_no_path
agree "0 8192 multipath 3 queue_if_no_path checker_interval_msecs 200 $paths"
restart
agree "0 8192 multipath 3 queue_if_no_path checker_interval_msecs 200 $paths"
both_down
read_bg ok
queued
kit a "$disk"
read_wait "case 1: after a restart, the queued read failed once a path came back"
kit b "$disk"; wait_path "$B" A
ms message m 0 fail_if_no_path
agree "0 8192 multipath 2 checker_interval_msecs 200 $paths"
restart
agree "0 8192 multipath 2 checker_interval_msecs 200 $paths"
both_down
read_check EIO || die "case 1: after fail_if_no_path and a restart, a read with no path did not fail"
both_up

# --- 2. no_path_retry 3: the message holds until a path is back -------------
t2="0 8192 multipath 4 no_path_retry 3 checker_interval_msecs 200 $paths"
ms reload m --table "$t2"
ms resume m
agree "$t2"
ms message m 0 fail_if_no_path
agree "$t2"
logged 'multipath: device m: fail_if_no_path: failing I/O when no path is left, until a path comes back \(then no_path_retry 3\)'
both_down
read_check EIO || die "case 2: fail_if_no_path: a read with no path did not fail at once"
# A path back: no_path_retry's queueing again.
both_up
both_down
read_bg EIO
queued
read_wait "case 2: the queued read did not fail after no_path_retry"
both_up
restart
agree "$t2"
both_down
read_bg EIO
queued
read_wait "case 2: after a restart, the queued read did not fail after no_path_retry"
logged 'no path for 3 checker intervals \(no_path_retry\): failing queued I/O'
echo "$0: ok"
