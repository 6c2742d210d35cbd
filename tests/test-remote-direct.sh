#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Direct connections (server/backends/nbd-wire.c): once libnbd's
# handshake is done, connections without TLS and without structured
# replies (every one but 0) speak NBD's transmission phase on the
# socket themselves.  Checked here:
#  - which connections are direct (the backend's debug log);
#  - data: reads and writes of 512 B to 1 MiB at queue depth 64, split
#    in parts of at most 64K (the server's maximum block size), checked
#    by fio's verify and against the backing file;
#  - a server without structured replies: connection 0 is direct too;
#  - a read's error reply (no data follows) among other replies;
#  - a reply that breaks the protocol (bad magic, an unknown cookie or
#    one of another generation) is named in the log and costs the
#    connection, not the request: it is retried, and the writes
#    acknowledged before count as lost (the next flush fails with EIO
#    once).  At queue depth 1 those requests are inline (the log says
#    so): the fault goes from the worker to the loop.
source "${top_srcdir:-$(dirname "$0")/..}/tests/functions.sh"

requires nbdkit --version
requires nbdkit --filter=blocksize-policy null --version
requires nbdkit --no-sr null --version
requires fio --enghelp=nbd
requires python3 -c 'import nbd'
requires cmp --version
requires timeout --version

f=$(mkfile r.img 64M)
start_server r --filter=blocksize-policy file "$f" \
    blocksize-maximum=64K blocksize-preferred=4K
g=$(mkfile n.img 1M)
start_server n --no-sr file "$g"
# e: reads fail at random while $tmpdir/e.fail exists.
e=$(mkfile e.img 1M)
start_server e --filter=error file "$e" error-pread=EIO \
    error-pread-rate=50% error-file="$tmpdir/e.fail"
mkdir "$tmpdir/ctl"
python3 "$top_srcdir/tests/nbd_proxy.py" "$tmpdir/p.sock" "$tmpdir/r.sock" \
    "$tmpdir/ctl" &
proxy=$!
cleanup_fn "kill_job $proxy"
wait_for test -e "$tmpdir/ctl/ready" || die "the proxy did not start"

# Two devices on the same backend: d directly, c through the proxy
# (which corrupts replies when told to; it is too slow for the data).
echo "0 131072 linear nbd+unix:///?socket=$tmpdir/r.sock 0" > "$tmpdir/d.table"
echo "0 131072 linear nbd+unix:///?socket=$tmpdir/p.sock 0" > "$tmpdir/c.table"
echo "0 2048 linear nbd+unix:///?socket=$tmpdir/n.sock 0" > "$tmpdir/n.table"
echo "0 2048 linear nbd+unix:///?socket=$tmpdir/e.sock 0" > "$tmpdir/e.table"
sock=$tmpdir/mapper.sock
uri="nbd+unix:///d?socket=$sock"
log=$tmpdir/mapper.log
start_server --stderr "$log" mapper -v -D nbdkit.backend.datapath=0 -t 64 \
    mapper remote-connections=4 remote-timeout=20 "$tmpdir/d.table" \
    "$tmpdir/c.table" "$tmpdir/n.table" "$tmpdir/e.table"
ms () { timeout 120 nbdsh -u "$uri" "$@"; }
# conns SOCK PATTERN: the backend SOCK's connection log lines matching
# PATTERN (grep -E), counted.
conns () { grep -E "$tmpdir/$1[^:]*: connection $2" "$log" | wc -l; }

# --- which connections are direct ---------------------------------------
ms -c 'h.pread(512, 0)'
wait_for sh -c "[ \$(grep -c 'r.sock.*: connection [0-9]* -> up' '$log') -ge 4 ]" ||
    die "not every connection came up"
for i in 1 2 3; do
    [ "$(conns r.sock "$i -> up \(direct\)")" -eq 1 ] ||
        die "connection $i is not direct"
done
[ "$(conns r.sock '0 -> up$')" -eq 1 ] ||
    die "connection 0 (structured replies, block status) went direct"

# Without structured replies, connection 0 is direct too (it has no
# block status to serve); its data goes both ways.
timeout 120 nbdsh -u "nbd+unix:///n?socket=$sock" -c '
h.pwrite(b"N" * 65536, 4096)
h.flush()
assert h.pread(65536, 4096) == b"N" * 65536
' || die "the device over the server without structured replies failed"
cmp -n 65536 -i 4096:0 "$g" <(head -c 65536 /dev/zero | tr '\0' N) ||
    die "the write did not reach the server without structured replies"
[ "$(conns n.sock '0 -> up \(direct\)')" -eq 1 ] ||
    die "connection 0 without structured replies is not direct"

# --- data -----------------------------------------------------------------
# Writes then reads of every size at depth 64, over all four connections
# (more than 32 in flight spill over to the next), each request split in
# 64K parts; fio checks what it reads back.
timeout 300 fio --name=direct --ioengine=nbd --uri="$uri" --rw=randrw \
    --bsrange=512-1m --bs_unaligned --iodepth=64 --size=32m \
    --verify=crc32c --verify_fatal=1 --do_verify=1 --randrepeat=1 \
    --output="$tmpdir/fio.out" ||
    { cat "$tmpdir/fio.out"; die "fio failed or found bad data"; }
# What the mapper serves is what the backend holds.
ms -c 'h.flush()'
python3 - "$sock" "$f" <<'PYEOF' || die "the mapper and the backing file differ"
import sys
from nbdcheck import connect
h = connect(sys.argv[1], "d")
with open(sys.argv[2], "rb") as f:
    for off in range(0, 64 << 20, 4 << 20):
        f.seek(off)
        assert h.pread(4 << 20, off) == f.read(4 << 20), off
PYEOF

# --- error replies -------------------------------------------------------
# A read's error reply has no data after it: the replies around it (reads
# that worked, writes) in the same batches must still be read right, and
# the connection is kept.
timeout 120 nbdsh -u "nbd+unix:///e?socket=$sock" -c '
for i in range(64):
    h.pwrite(bytes([i + 1]) * 4096, i * 4096)
' || die "e: writing the pattern failed"
touch "$tmpdir/e.fail"
timeout 120 nbdsh -u "nbd+unix:///e?socket=$sock" -c '
import errno
from nbdcheck import aio_wait
bufs = [nbd.Buffer(4096) for i in range(64)]
reads = [h.aio_pread(bufs[i], i * 4096) for i in range(64)]
writes = [h.aio_pwrite(nbd.Buffer.from_bytearray(bytearray(b"E" * 4096)),
                       (128 + i) * 4096) for i in range(32)]
failed = 0
for i, c in enumerate(reads):
    e = aio_wait(h, c)
    assert e in (0, errno.EIO), e
    if e:
        failed += 1
    else:
        assert bufs[i].to_bytearray() == bytes([i + 1]) * 4096, i
for c in writes:
    assert aio_wait(h, c) == 0, "a write failed"
assert 0 < failed < 64, "%d of 64 reads failed" % failed
' || die "e: the replies after a failed read went wrong"
rm -f "$tmpdir/e.fail"
timeout 120 nbdsh -u "nbd+unix:///e?socket=$sock" -c '
assert h.pread(4096 * 32, 128 * 4096) == b"E" * 4096 * 32
' || die "e: the writes did not land"
[ "$(conns e.sock '[0-9]+ up -> down')" -eq 0 ] ||
    die "e: a read's error reply cost the connection"
[ "$(conns e.sock '[123] -> up \(direct\)')" -ge 1 ] ||
    die "e: no direct connection"

# --- a reply that breaks the protocol -------------------------------------
# corrupt WHAT PATTERN: the next reply the server sends has its WHAT
# flipped (the proxy's ctl/corrupt).  A write acknowledged before, then a
# read whose reply is the corrupted one: the read is retried and returns
# the data, the log names the fault (PATTERN), the next flush fails with
# EIO once (the write may be gone with the connection), and the
# connection comes back, direct.
corrupt ()
{
    local downs ups said
    downs=$(conns p.sock '[0-9]+ up -> down: ')
    said=$(conns p.sock "[123] up -> down: $2 \(inline\)$")
    ups=$(conns p.sock '[0-9]+ -> up \(direct\)')
    timeout 120 nbdsh -u "nbd+unix:///c?socket=$sock" -c '
import os
from nbdcheck import fails_eio
h.pwrite(b"W" * 4096, 8192)
open("'"$tmpdir"'/ctl/corrupt", "w").write("'"$1"'")
assert h.pread(4096, 8192) == b"W" * 4096
assert not os.path.exists("'"$tmpdir"'/ctl/corrupt"), "nothing corrupted"
assert fails_eio(h.flush), "the flush after a lost connection worked"
assert not fails_eio(h.flush), "the second flush failed"
' || die "$1: the request or the flush went wrong"
    [ "$(conns p.sock '[0-9]+ up -> down: ')" -eq $((downs + 1)) ] ||
        die "$1: not one connection dropped"
    [ "$(conns p.sock "[123] up -> down: $2 \(inline\)$")" -eq $((said + 1)) ] ||
        { grep 'p.sock.* up -> down: ' "$log" | tail -1;
          die "$1: the log does not say /$2/"; }
    wait_for sh -c "[ \$(grep -Ec 'p.sock[^:]*: connection [0-9]+ -> up \(direct\)' '$log') -gt $ups ]" ||
        die "$1: the connection did not come back"
}
# Every connection of c up first: a handshake must not take the flip.
timeout 120 nbdsh -u "nbd+unix:///c?socket=$sock" -c 'h.pread(512, 0)'
wait_for sh -c "[ \$(grep -c 'p.sock.*: connection [0-9]* -> up' '$log') -ge 4 ]" ||
    die "not every connection of c came up"
corrupt magic 'bad reply magic 0x32446698 \(expected 0x67446698\)'
corrupt cookie 'reply to an unknown request \(cookie 0x[0-9a-f]{16}\)'
# The cookie of a request in flight, of another generation (a slot's
# cookie changes each time it is reused).
corrupt gen 'reply to an unknown request \(cookie 0x[0-9a-f]{16}\)'

echo "$0: ok"
