#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# A multipath device whose every path goes silent at once, as when the
# storage behind them all stalls (a long flush on a busy disk, a stalled
# host): its two servers (qemu-nbd over one file) stopped with SIGSTOP
# for longer than the path timeout (1 s), remote-timeout 600 s.
#
#  1. Not queueing: the path timeout fails the path the read was on and
#     reissues it on the other, but never fails that last path (its
#     requests would fail with EIO, and there is nowhere to send them):
#     the log says so, and the read waits.  When the failed path's
#     server goes on (SIGCONT) and the checker reinstates it, the last
#     one, still silent, is failed in turn and the read completes on the
#     other with the right data.
#  2. With queue_if_no_path the last path is failed too (the read is
#     queued, not failed), and the read completes once the checker has
#     reinstated a path.
#  3. SIGTERM while the last path is kept with a read on it: the server
#     stops (the read fails), without waiting for remote-timeout.
# qemu-nbd, not nbdkit: giving a path up closes its connections while
# its server may be sending a reply, which nbdkit 1.32 aborts on (see
# test-multipath-netns.sh).
source "${top_srcdir:-$(dirname "$0")/..}/tests/functions-mpath.sh"

requires qemu-nbd --version
requires python3 -c 'import nbd'
requires timeout --version

disk=$(mkfile disk.img 4M)
fill_random "$disk" 4194304 13
qemu a "$disk"
qemu b "$disk"
A=$(qemu_uri a) B=$(qemu_uri b)
# stall / go_on: both servers stopped / running again.
stall () { kill -STOP "$(cat "$tmpdir/a.pid")" "$(cat "$tmpdir/b.pid")"; }
go_on () { kill -CONT "$(cat "$tmpdir/a.pid")" "$(cat "$tmpdir/b.pid")"; }
# Never left stopped (stop_server would wait for them, then SIGKILL).
cleanup_fn 'go_on 2>/dev/null'
# nr_failed: how many paths status says are failed.
nr_failed () { ms status m | grep -o ' F ' | wc -l; }

echo "0 8192 multipath 2 checker_interval_msecs 200 0 1 1 round-robin 0 2 0 $A $B" \
    > "$tmpdir/m.table"
start_mapper "$tmpdir/m.table" remote-timeout=600
read_check ok

# --- 1. not queueing: the last path stays --------------------------------
stall
read_bg ok
wait_for grep -Eq "path .* failed \(no reply for [0-9]+ ms\), 1 of 2 paths left" \
    "$tmpdir/log" || { ms status m; die "case 1: no path failed by the path timeout"; }
sleep 2                         # two more path timeouts
[ "$(nr_failed)" = 1 ] || die "case 1: the last path failed too: $(ms status m)"
kill -0 "$rd" 2>/dev/null || { cat "$tmpdir/rd.out"; die "case 1: the read did not wait"; }
logged 'multipath .*m\.table: path .*: no reply for [0-9]+ ms, but it is the last active path and the device does not queue: not failed'
# The failed path's server goes on: once the checker has reinstated it,
# the last one (still stopped) is failed, and the read reissued there.
if path_is "$A" F; then gone=a kept=b G=$A K=$B; else gone=b kept=a G=$B K=$A; fi
kill -CONT "$(cat "$tmpdir/$gone.pid")"
read_wait "case 1: the read failed, the stall of every path turned into an error"
wait_path "$G" A
path_is "$K" F || die "case 1: the kept path, still silent, was not failed: $(ms status m)"
kill -CONT "$(cat "$tmpdir/$kept.pid")"
wait_path "$K" A
read_check ok

# --- 2. queueing: the last path is failed, the read queued -----------------
ms message m 0 queue_if_no_path
stall
read_bg ok
queued
[ "$(nr_failed)" = 2 ] || die "case 2: status: $(ms status m)"
go_on
read_wait "case 2: the queued read failed once the servers went on"
wait_path "$A" A; wait_path "$B" A
read_check ok
stop_server ctl

# --- 3. a stop while the last path is kept ----------------------------------
# SIGTERM with a read waiting on it: the last path is given up after all
# (the read fails), not held for remote-timeout (600 s).
start_mapper "$tmpdir/m.table" remote-timeout=600
read_check ok
stall
read_bg gone
wait_for grep -q 'but it is the last active path' "$tmpdir/log" ||
    { tail -5 "$tmpdir/log"; die "case 3: the last path was not kept"; }
stop_server ctl || die "case 3: the stop waited for the kept path"
read_wait "case 3: the read did not end at the stop"
go_on
echo "$0: ok"
