#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# A remote backend whose server comes back without multi-conn goes on
# with one connection: requests (retried ones included) are served, the
# writes acknowledged before the loss make the next flush fail with EIO
# once, and the other connections are not reopened.  A server that comes
# back read-only, smaller or without flush breaks a promise of the first
# handshake: it is not used (requests fail with EIO) until one that keeps
# them is back.
#
# The server is nbdkit eval over a file (dd), whose can_multi_conn we
# choose; nbdkit 1.32's multi-conn filter asserts when a client closes a
# connection mid-handshake, which is what closing the others does.
source "${top_srcdir:-$(dirname "$0")/..}/tests/functions.sh"

requires nbdkit --version
requires nbdsh --version
requires nbdkit eval --version
requires dd --version
requires timeout --version

f=$(mkfile r.img 4M)
# server MULTI-CONN [NBDKIT-OPTIONS...]: (re)start the backend r on $f,
# allowing multi-conn (yes) or not (no); of size $size if set, without
# flush if $noflush is set.
server ()
{
    local mc=3 fl=0
    [ "$1" = yes ] && mc=0
    [ -z "${noflush:-}" ] || fl=3
    shift
    start_server r "$@" eval get_size="echo ${size:-4194304}" \
        pread="dd if='$f' skip=\$4 count=\$3 iflag=skip_bytes,count_bytes status=none" \
        pwrite="dd of='$f' seek=\$4 conv=notrunc oflag=seek_bytes status=none" \
        can_write='exit 0' can_flush="exit $fl" flush="sync '$f'" \
        can_multi_conn="exit $mc"
}
server yes                      # remote-connections (4) connections
echo "0 8192 linear nbd+unix:///?socket=$tmpdir/r.sock 0" > "$tmpdir/d.table"
sock=$tmpdir/mapper.sock
uri="nbd+unix:///?socket=$sock"
log=$tmpdir/mapper.log
# remote-timeout: the restarts below must be over (kill, start, the
# mapper's reconnect backoff of up to 1 s) within it, or the retried read
# fails as it should after a longer outage; 3 s was too short on a loaded
# machine.  The refused reads wait it out.
start_server --stderr "$log" mapper -v -D nbdkit.backend.datapath=0 mapper \
    remote-timeout=10 "$tmpdir/d.table"
ms () { timeout 120 nbdsh -u "$uri" "$@"; }

ms -c 'h.pwrite(b"A" * 65536, 0)' -c 'h.flush()'
wait_for sh -c "[ \$(grep -c 'connection [0-9]* -> up' '$log') -ge 4 ]" ||
    die "not every connection came up"
# A connection with a write acknowledged, not flushed, open across the
# outage: its next flush must fail (one opened after it would not).
ms -c '
import os
from nbdcheck import aio_wait, fails_eio, until
d = "'"$tmpdir"'"
h.pwrite(b"B" * 4096, 65536)                    # acknowledged, not flushed
open(d + "/written", "w").close()
until(lambda: os.path.exists(d + "/go"), "the backend did not come back")
assert h.pread(4096, 65536) == b"B" * 4096     # retried on the one left
assert fails_eio(h.flush), "flush after the lost connections succeeded"
h.flush()                                       # once only
# Deep queue on the one connection.
cookies = [h.aio_pwrite(nbd.Buffer.from_bytearray(bytearray([i]) * 4096),
                        (32 + i) * 4096) for i in range(64)]
for c in cookies:
    assert aio_wait(h, c) == 0
h.flush()
for i in range(64):
    assert h.pread(4096, (32 + i) * 4096) == bytes([i]) * 4096
' > "$tmpdir/client.out" 2>&1 &
client=$!
wait_for test -e "$tmpdir/written" || die "the client did not write"

# Back without multi-conn.
stop_server r KILL
server no
touch "$tmpdir/go"
wait $client || { cat "$tmpdir/client.out"; grep 'nbd+unix' "$log" | tail -30; die "no multi-conn: the device failed"; }
line=$(grep -n 'no longer allows multi-conn' "$log" | cut -d: -f1)
[ "$(echo "$line" | wc -w)" = 1 ] ||
    { grep 'nbd+unix' "$log" | tail -30; die "no multi-conn: not once in the log"; }
grep 'no longer allows multi-conn' "$log"
kept=$(sed -n "${line}s/.*connection \([0-9]*\) only.*/\1/p" "$log")
# Without it, the check below would take every connection for another.
[ -n "$kept" ] || die "no multi-conn: the log does not say which connection"
others=$(tail -n +"$((line + 1))" "$log" |
         grep -E 'connection [0-9]+ -> (connecting|up)' |
         grep -v "connection $kept " || :)
[ -z "$others" ] || die "other connections reopened: $others"
cmp -n 65536 "$f" <(head -c 65536 /dev/zero | tr '\0' A) || die "data lost"
echo "no multi-conn: one connection (number $kept) serves the device"

# refused WHY MULTI-CONN [NBDKIT-OPTIONS...]: the backend comes back as
# "server MULTI-CONN NBDKIT-OPTIONS", which breaks a promise of the first
# handshake: WHY in the log once the mapper has tried it, and not used (a
# read fails with EIO).
refused ()
{
    local why=$1; shift
    stop_server r KILL
    server "$@"
    wait_for grep -q "reconnected, but $why: not using it" "$log" ||
        { grep 'nbd+unix' "$log" | tail -30; die "$why: not refused"; }
    ms -c '
from nbdcheck import fails_eio
assert fails_eio(h.pread, 4096, 0), "read through a refused connection worked"
' || die "$why: the read did not fail with EIO"
}
# Back read-only, smaller, without flush: refused; back as it was: used
# again.
refused "the export became read-only" no -r
size=2097152 refused "the export shrank" no
noflush=1 refused "the export lost a capability" no
stop_server r KILL
server no
ms -c '
from nbdcheck import when_back
data = when_back(h.pread, 4096, 32 * 4096, seconds=30)
assert data == bytes(4096)
h.pwrite(b"C" * 4096, 0)
h.flush()
' || die "writable server back: the device failed"
echo "read-only, smaller, flushless servers refused; the writable one used again"
# The mapper first: its connections would hold the backend's exit up.
stop_server mapper
echo "$0: ok"
