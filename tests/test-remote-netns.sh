#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# A remote backend in another network namespace, and the link to it cut.
#
# Namespace B runs the backend (nbdkit file) on its end of a veth pair,
# namespace A runs nbdkit mapper with a remote device on it and a local
# device; clients reach the mapper over a Unix socket (which works across
# namespaces).  A link set down is not a killed server: no RST, no FIN,
# established connections just stop answering and only the mapper's own
# timers notice.
#
#  1. B's end goes down for a second in the middle of a verified fio run
#     (remote-timeout=10): fio finishes with no error, the local device
#     works meanwhile, and the remote device reads back byte for byte what
#     the backend's file holds.
#  2. A's end goes down and stays down (remote-timeout=3), so reconnects
#     fail at once (ENETUNREACH): remote reads and writes fail with EIO
#     instead of hanging (every client call is under a timeout), each
#     connection is dropped as stalled, and once the backend has had no
#     connection for longer than remote-timeout, requests fail at once
#     rather than each waiting out its own timeout; the local device keeps
#     working and the server stays up.  Once the link is back, the device
#     works again.
#  3. A write acknowledged before the loss and never flushed: the next
#     flush fails with EIO, once; the one after succeeds.
#
# The host's own interfaces and addresses are never touched: the two
# namespaces and the veth pair between them are created here (the pair
# directly inside them) and deleted at exit.  Skips (77) without iproute2
# or the right to create namespaces.
source "${top_srcdir:-$(dirname "$0")/..}/tests/functions.sh"

requires nbdkit --version
requires python3 -c 'import nbd'
requires nbdcopy --version
requires fio --version
requires sh -c 'fio --enghelp=nbd 2>&1 | grep -q uri'
requires ip -V
requires timeout --version

nsa=nbdm-a-$$ nsb=nbdm-b-$$
addr_a=10.77.0.1 addr_b=10.77.0.2 port=10809   # private to the namespaces

netns_veth "$nsa" "$nsb" "$addr_a" "$addr_b"

# link NS DEV up|down
link () { ip -n "$1" link set "$2" "$3"; }

# The backend, in B on its veth address only.
f=$(mkfile remote.img 16M)
start_server --wrap "ip netns exec $nsb" r -i "$addr_b" -p "$port" file "$f"
# At exit with SIGKILL: connections that lived through a cut link still have data
# and their FIN queued behind a backed-off retransmission timer when the
# mapper closes them (ss shows FIN-WAIT-1 on the mapper's side,
# ESTABLISHED here), so the backend hears of their end only minutes
# later, and nbdkit 1.32 waits at exit for its clients to go.  It is not
# the server under test (the mapper is stopped with SIGTERM).
cleanup_fn "stop_server r KILL"

l=$(mkfile local.img 1M)
echo "0 32768 linear nbd://$addr_b:$port/ 0" > "$tmpdir/remote.table"
echo "0 2048 linear $l 0" > "$tmpdir/local.table"
sock=$tmpdir/mapper.sock
remote="nbd+unix:///remote?socket=$sock"
local_uri="nbd+unix:///local?socket=$sock"

# start_mapper TIMEOUT LOG: the mapper in A, daemonised on $sock, with -v
# (connection state changes) but not nbdkit's per-request messages.
start_mapper ()
{
    start_server --wrap "ip netns exec $nsa" --stderr "$2" mapper -v \
        -D nbdkit.backend.datapath=0 mapper remote-timeout="$1" \
        "$tmpdir/remote.table" "$tmpdir/local.table"
}
stop_mapper () { stop_server mapper; }

# --- 1. cut and restored within remote-timeout ----------------------------
start_mapper 10 "$tmpdir/mapper1.log"
# About 3 s of rate-limited verified writes, then the verify pass; the
# link is down from 1 s to 2 s.  "timeout" turns a hang into a failure.
( cd "$tmpdir" &&
  exec timeout 120 fio --name=cut --ioengine=nbd --uri="$remote" \
    --rw=randwrite --bs=4k --size=16M --io_size=8M --iodepth=16 \
    --rate_iops=700 --verify=crc32c --do_verify=1 --verify_fatal=1 \
    --verify_state_save=0 ) > "$tmpdir/fio.out" 2>&1 &
fio=$!
sleep 1
link "$nsb" vb down
# The local device serves while the remote one is cut off.
timeout 60 nbdsh -u "$local_uri" -c '
for i in range(16):
    h.pwrite(bytes([65 + i]) * 4096, i * 4096)
for i in range(16):
    assert h.pread(4096, i * 4096) == bytes([65 + i]) * 4096
h.flush()
' || die "case 1: the local device failed while the link was down"
sleep 1
kill -0 "$fio" 2>/dev/null || { cat "$tmpdir/fio.out"; die "case 1: fio ended before the link came back"; }
link "$nsb" vb up
wait "$fio" || { cat "$tmpdir/fio.out"; die "case 1: fio failed"; }
if grep -Ei 'verify.*(fail|bad)|bad magic|err= *[1-9]' "$tmpdir/fio.out"; then
    cat "$tmpdir/fio.out"; die "case 1: fio reported errors"
fi
grep -E 'WRITE:' "$tmpdir/fio.out"
sed -n '/ write: /,$p' "$tmpdir/fio.out" | grep -m1 -E '^ +clat'   # the stall
timeout 120 nbdcopy "$remote" "$tmpdir/readback.img" ||
    die "case 1: reading the device back failed"
cmp "$tmpdir/readback.img" "$f" ||
    die "case 1: the device and the backend's file differ"
echo "case 1: link down for 1s during fio --verify: no error, data intact"
stop_mapper

# --- 2. cut and left down; 3. flush after the loss ------------------------
start_mapper 3 "$tmpdir/mapper2.log"
log=$tmpdir/mapper2.log
: "${NBDMSETUP:=$top_builddir/client-tools/nbdmsetup/nbdmsetup}"
timeout 300 python3 "$top_srcdir/tests/remote_netns.py" "$sock" "$nsa" "$f" "$tmpdir/mapper.pid" \
        "$log" 3 "$NBDMSETUP" ||
    { link "$nsa" va up || :; grep 'nbd://' "$log" | tail -40; die "case 2/3"; }

# The log: connections dropped as stalled, reconnects failing while the
# link was down, and a connection up again after it came back.
grep -E 'connection [0-9]+ up -> down: request timed out' "$log"
grep -Eq 'connection [0-9]+: connect: .*unreachable' "$log" ||
    { grep 'nbd://' "$log" | tail -40; die "no failed reconnect in the log"; }
first=$(grep -nE 'up -> down: request timed out' "$log" | head -1 | cut -d: -f1)
tail -n +"$first" "$log" | grep -Eq 'connection [0-9]+ -> up' ||
    { grep 'nbd://' "$log" | tail -40; die "no connection came back up in the log"; }
kill -0 "$(cat "$tmpdir/mapper.pid")" || die "the mapper is gone"
echo "$0: ok"
