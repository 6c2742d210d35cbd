#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# One flush per dirty remote backend, counted by the backends themselves
# (nbdkit's stats filter): a 1024-target table over one remote backend and
# a 64-target table over four.  Nothing written -> no backend flush;
# 8 client connections flushing at once after one write share flushes;
# and a flushed write survives kill -9 of its backend's server.
source "${top_srcdir:-$(dirname "$0")/..}/tests/functions.sh"
requires nbdsh --version
requires nbdkit --filter=stats null --version

size=$((16 << 20))
sectors=$((size / 512))
for i in 0 1 2 3 4 5; do
    truncate -s $size "$tmpdir/f$i"
    start_server b$i --filter=stats file "$tmpdir/f$i" statsfile="$tmpdir/stats$i"
done
uri () { echo "nbd+unix:///?socket=$tmpdir/b$1.sock"; }

# wide: 1024 targets on b0.  multi: 64 targets, target i on b(1 + i % 4).
python3 - "$sectors" "$(uri 0)" > "$tmpdir/wide.table" <<'PY'
import sys
sectors, u = int(sys.argv[1]), sys.argv[2]
per = sectors // 1024
for i in range(1024):
    print(f"{i*per} {per} linear {u} {i*per}")
PY
python3 - "$sectors" "$(uri 1)" "$(uri 2)" "$(uri 3)" "$(uri 4)" \
    > "$tmpdir/multi.table" <<'PY'
import sys
sectors, uris = int(sys.argv[1]), sys.argv[2:]
per = sectors // 16
for i in range(64):
    print(f"{i*per} {per} linear {uris[i % 4]} {(i // 4) * per}")
PY
per=$((size / 16))
echo "0 $sectors linear $(uri 5) 0" > "$tmpdir/dur.table"

sock=$tmpdir/mapper.sock
start_server mapper mapper remote-timeout=20 \
    "$tmpdir/wide.table" "$tmpdir/multi.table" "$tmpdir/dur.table"

nbdsh -c "
import nbd
def conn(name):
    x = nbd.NBD(); x.connect_uri('nbd+unix:///%s?socket=$sock' % name)
    return x
h = conn('wide'); m = conn('multi')
# Nothing written: no backend flush.
for i in range(3):
    h.flush(); m.flush()
# 10 x (write, flush) on wide: 10 flushes of b0, whatever the targets.
for i in range(10):
    h.pwrite(b'w' * 4096, (i * 997 * 4096) % ($size - 4096))
    h.flush()
    h.flush()                       # clean again: nothing sent
# 10 x a write across targets 0 and 1 of multi (b1 and b2), then flush.
for i in range(10):
    m.pwrite(b'm' * 1024, $per - 512)
    m.flush()
# One write over all four, flushed twice: one flush each.
m.pwrite(bytearray(4 * $per), 0)
m.flush(); m.flush()
# Eight connections flush at once after one write: they share.
hs = [conn('wide') for i in range(8)]
hs[0].pwrite(b'q' * 4096, 8192)
cookies = [x.aio_flush() for x in hs]
for x, c in zip(hs, cookies):
    while not x.aio_command_completed(c):
        x.poll(-1)
"

# Durability: a flushed write survives kill -9 of its backend's server,
# read back through the mapper once the backend is back.
nbdsh -u "nbd+unix:///dur?socket=$sock" -c "
h.pwrite(b'durable!' * 512, 1 << 20)
h.flush()
"
stop_server b5 KILL
start_server b5 file "$tmpdir/f5"
nbdsh -u "nbd+unix:///dur?socket=$sock" -c "
assert h.pread(4096, 1 << 20) == b'durable!' * 512
"
cmp -n 4096 -i $((1 << 20)):0 "$tmpdir/f5" <(python3 -c "
import sys; sys.stdout.buffer.write(b'durable!' * 512)") ||
    die "flushed data not in the backing file"

# Stop the backends so the stats filter writes its counts.
stop_server mapper
for i in 0 1 2 3 4; do stop_server b$i; done
flushes () { sed -n 's/^flush: \([0-9]*\) ops.*/\1/p' "$1"; }
echo "backend flushes: b1..b4: $(for i in 1 2 3 4; do printf '%s ' "$(flushes "$tmpdir/stats$i")"; done)"
[ "$(flushes "$tmpdir/stats1")" = 11 ] || die "b1: $(flushes "$tmpdir/stats1") flushes, expected 11"
[ "$(flushes "$tmpdir/stats2")" = 11 ] || die "b2: $(flushes "$tmpdir/stats2") flushes, expected 11"
[ "$(flushes "$tmpdir/stats3")" = 1 ] || die "b3: $(flushes "$tmpdir/stats3") flushes, expected 1"
[ "$(flushes "$tmpdir/stats4")" = 1 ] || die "b4: $(flushes "$tmpdir/stats4") flushes, expected 1"
# b0: 10 write+flush pairs, then 8 concurrent flushes after one write
# share: 11 if they all joined one backend flush, never 18.
b0=$(flushes "$tmpdir/stats0")
echo "backend flushes: b0: $b0 (10 + 8 concurrent client flushes)"
[ "$b0" -ge 11 ] && [ "$b0" -lt 18 ] || die "b0: $b0 flushes, expected 11..17"
