#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# One flush per dirty backend, counted at the system call: strace counts
# fdatasync while clients flush a 1024-target table over one file and a
# 64-target table over four files.  Nothing written -> no fdatasync;
# concurrent flushes from 8 connections share one backend flush.  The
# fdatasync calls of one flush (or FUA write) over several files are
# handed to the local pool, so they are not all on the client's thread
# (test-unit-flush proves they run side by side).
source "${top_srcdir:-$(dirname "$0")/..}/tests/functions.sh"
requires strace -V
requires nbdsh --version

size=$((64 << 20))
sectors=$((size / 512))
for f in a b c d e; do truncate -s $size "$tmpdir/$f"; done

# wide: 1024 contiguous targets over file a.
python3 - "$tmpdir" "$sectors" > "$tmpdir/wide.table" <<'PY'
import sys
d, sectors = sys.argv[1], int(sys.argv[2])
per = sectors // 1024
for i in range(1024):
    print(f"{i*per} {per} linear {d}/a {i*per}")
PY
# multi: 64 targets, target i on file b/c/d/e (i % 4).
python3 - "$tmpdir" "$sectors" > "$tmpdir/multi.table" <<'PY'
import sys
d, sectors = sys.argv[1], int(sys.argv[2])
per = sectors // 16
for i in range(64):
    f = "bcde"[i % 4]
    print(f"{i*per} {per} linear {d}/{f} {(i // 4) * per}")
PY

sock=$tmpdir/m.sock
log=$tmpdir/strace.log
# In the foreground under strace (stop_server stops nbdkit itself, then
# waits for strace).
start_server --wrap "strace -f -qq -e trace=fdatasync -o $log" m \
    -f mapper "$tmpdir/wide.table" "$tmpdir/multi.table"

count () { grep -cE '^[0-9]+ +fdatasync\(' "$log" || :; }
# threads_since LINE: distinct threads among fdatasync calls after LINE.
threads_since ()
{
    grep -E '^[0-9]+ +fdatasync\(' "$log" | tail -n +"$(( $1 + 1 ))" |
        awk '{print $1}' | sort -u | wc -l
}

# expect_flushes N 'python using h (wide) and m (multi)'
expect_flushes ()
{
    local want=$1 before after
    before=$(count)
    nbdsh -c "
import nbd
h = nbd.NBD(); h.connect_uri('nbd+unix:///wide?socket=$sock')
m = nbd.NBD(); m.connect_uri('nbd+unix:///multi?socket=$sock')
$2
"
    after=$(count)
    [ $((after - before)) -eq "$want" ] ||
        die "'$2': $((after - before)) fdatasync calls, expected $want"
    echo "ok: $want fdatasync for: $(echo "$2" | tr '\n' ';')"
}

per=$((size / 16))
expect_flushes 0 'h.flush(); m.flush()'
expect_flushes 1 'h.pwrite(b"x", 12345); h.flush()'
expect_flushes 0 'h.flush(); h.flush()'
# Many targets, one file: a write across 1000 targets, then one flush.
expect_flushes 1 "h.pwrite(bytearray(1000 * $((size / 1024))), 0); h.flush()"
# Four files: touch two of them, then all four.
expect_flushes 2 "m.pwrite(b'y' * 1024, $per - 512); m.flush()"
mark=$(count)
expect_flushes 4 "m.pwrite(bytearray(4 * $per), 0); m.flush(); m.flush()"
[ "$(threads_since "$mark")" -ge 2 ] ||
    die "a flush of 4 files: all 4 fdatasync on one thread"
echo "ok: the 4 fdatasync ran on $(threads_since "$mark") threads"
# A FUA write over four files: pwrite + fdatasync on each, side by side.
mark=$(count)
expect_flushes 4 "m.pwrite(bytearray(4 * $per), 0, nbd.CMD_FLAG_FUA); m.flush()"
[ "$(threads_since "$mark")" -ge 2 ] ||
    die "a FUA write over 4 files: all 4 fdatasync on one thread"
echo "ok: a FUA write over 4 files: 4 fdatasync on $(threads_since "$mark") threads"
# Two devices, five distinct backends: each flush only its own.
expect_flushes 5 'h.pwrite(b"z", 0); m.pwrite(bytearray(4 * '$per'), 0); h.flush(); m.flush()'
# FUA on a native-FUA file backend: durable by itself, flush then clean.
expect_flushes 1 'h.pwrite(b"f", 99, nbd.CMD_FLAG_FUA); h.flush()'

# Eight connections flush concurrently after one write: they share.
before=$(count)
nbdsh -c "
import nbd
hs = []
for i in range(8):
    x = nbd.NBD(); x.connect_uri('nbd+unix:///wide?socket=$sock'); hs.append(x)
hs[0].pwrite(b'q' * 4096, 8192)
cookies = [x.aio_flush() for x in hs]
for x, c in zip(hs, cookies):
    while not x.aio_command_completed(c):
        x.poll(-1)
# Every write durable: the data is in the file after the flushes.
assert open('$tmpdir/a', 'rb').read()[8192:8192+4096] == b'q' * 4096
"
after=$(count)
n=$((after - before))
[ "$n" -ge 1 ] || die "8 concurrent flushes after a write: no fdatasync"
[ "$n" -lt 8 ] || die "8 concurrent flushes: $n fdatasync calls (not shared)"
echo "ok: 8 concurrent client flushes -> $n fdatasync"
