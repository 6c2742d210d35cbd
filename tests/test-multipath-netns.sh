#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# A multipath device whose first path is an NBD server in another
# network namespace, reached over a veth pair, and whose second is a
# local server on a Unix socket (qemu-nbd and nbdkit over one file).  The link is
# cut (set down: no RST, no FIN, the connections just stop answering) in
# the middle of a verified fio run and left down to its end: fio sees no
# error, the path is failed by its path timeout (remote-timeout is 600
# s) and the requests it held are reissued on the other path; once the
# link is up again the path checker reinstates it.  The device then reads back the
# file.  The host's own interfaces are never touched; skips (77) without
# iproute2 or the right to create namespaces.
source "${top_srcdir:-$(dirname "$0")/..}/tests/functions-mpath.sh"

requires nbdkit --version
requires qemu-nbd --version
requires nbdinfo --version
requires nbdcopy --version
requires fio --version
requires sh -c 'fio --enghelp=nbd 2>&1 | grep -q uri'
requires ip -V

nsa=nbdm-mpa-$$ nsb=nbdm-mpb-$$
addr_a=10.78.0.1 addr_b=10.78.0.2 port=10809   # private to the namespaces
netns_veth "$nsa" "$nsb" "$addr_a" "$addr_b"

disk=$(mkfile disk.img 16M)
fill_random "$disk" 16777216 11
# qemu-nbd, not nbdkit: nbdkit 1.32 aborts (connections.c raw_send_socket:
# "Assertion `sock >= 0' failed") when a client closes a connection
# while a worker is still sending a reply, which is what giving a path
# up does to its server.
rm -f "$tmpdir/r.pid"
ip netns exec "$nsb" qemu-nbd -f raw -t --shared=64 -b "$addr_b" -p "$port" \
    --pid-file="$tmpdir/r.pid" "$disk" 2> "$tmpdir/r.log" &
_started r false
wait_file "$tmpdir/r.pid"
wait_for ip netns exec "$nsb" nbdinfo --size "nbd://$addr_b:$port/" ||
    die "qemu-nbd in $nsb does not serve"
# At exit with SIGKILL: connections that lived through the cut may keep
# their end queued behind a backed-off retransmission (see
# test-remote-netns.sh); it is not the server under test.
cleanup_fn "stop_server r KILL"
kit k "$disk"
K=$(kit_uri k)
R=nbd://$addr_b/                # as status prints it: 10809 is the default

echo "0 32768 multipath 2 checker_interval_msecs 200 0 1 1 round-robin 0 2 0 nbd://$addr_b:$port/ $K" \
    > "$tmpdir/m.table"
start_server --wrap "ip netns exec $nsa" --stderr "$tmpdir/log" ctl -f \
    -v -D nbdkit.backend.datapath=0 mapper remote-timeout=600 "$tmpdir/m.table"

fio_start cut 6
sleep 1
ip -n "$nsb" link set vb down
wait_path "$R" F
# The link stays down to the end of the run: the requests it held were
# given up on it (never to complete there: remote-timeout is 600 s) and
# reissued on the local path.
fio_check cut
ip -n "$nsb" link set vb up
wait_for path_is "$R" A || {
    kill -0 "$(cat "$tmpdir/r.pid")" || echo "the server in $nsb is gone"
    tail -5 "$tmpdir/r.log"; wait_path "$R" A; }
status_ends " $R A 1 $K A 0"
logged "path $(re "$R") failed \(no reply for [0-9]+ ms\), 1 of 2 paths left"
logged "path $(re "$R") reinstated \(path checker\), 2 of 2 paths active"
same_data "$disk"
echo "$0: ok"
