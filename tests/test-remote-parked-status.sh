#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# `nbdmsetup status --backends` right after a remote backend's server
# died.  Connections parked for inline requests are not watched
# (server/backends/nbd-wire.c): the loop looks at them every
# min(1 s, remote-timeout / 4), and until then they kept counting as up,
# so a status asked for at once said 1/4 or more up of a server that was
# gone (test-remote-replies.sh failed on it in CI: its wait for 3/4 up
# counted such a stale connection, which the I/O after it then lost).
# The status looks at parked connections itself now: 0/4 up, 4 lost.
# Then the server comes back, and every connection with it.
source "${top_srcdir:-$(dirname "$0")/..}/tests/functions.sh"

requires nbdkit --version
requires python3 -c 'import nbd'

f=$(mkfile r.img 8M)
start_server r file "$f"
echo "0 16384 linear nbd+unix:///?socket=$tmpdir/r.sock 0" > "$tmpdir/d.table"
start_server m mapper remote-connections=4 remote-timeout=30 \
    "$tmpdir/d.table"

# Every connection up, then QD1 reads: after 32 alone they go inline, on
# parked connections, and one is parked when the last is done.
wait_conns_up m d 4/4
timeout 120 nbdsh -u "nbd+unix:///d?socket=$tmpdir/m.sock" -c '
h.pwrite(b"p" * 4096, 4096)
for i in range(200):
    assert h.pread(4096, 4096) == b"p" * 4096, i
' || die "QD1 reads failed"
backend_status m || die "status --backends"
inline=$(sed -nE 's/.*, ([0-9]+) inline.*/\1/p' "$tmpdir/status.out")
[ -n "$inline" ] && [ "$inline" -gt 0 ] ||
    { cat "$tmpdir/status.out"; die "no request went inline: nothing parked"; }
grep -q '4/4 connections up' "$tmpdir/status.out" ||
    { cat "$tmpdir/status.out"; die "not 4/4 up before the kill"; }

# The server dies; the status at once knows of every connection.
stop_server r KILL
backend_status m || die "status --backends"
grep -q '0/4 connections up' "$tmpdir/status.out" &&
    grep -q ', 4 connections lost' "$tmpdir/status.out" ||
    { cat "$tmpdir/status.out"; die "right after the kill: not 0/4 up, 4 lost"; }

# It comes back: every connection with it, and the data.
start_server r file "$f"
wait_conns_up m d 4/4
timeout 60 nbdsh -u "nbd+unix:///d?socket=$tmpdir/m.sock" \
    -c 'assert h.pread(4096, 4096) == b"p" * 4096' ||
    die "the data after the server came back"
stop_server m
echo "test-remote-parked-status: ok"
