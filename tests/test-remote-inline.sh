#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Inline requests (server/backends/nbd-wire.c's ownership protocol): a
# request alone in its client request takes an idle direct connection
# and is sent, waited for and read by its worker, not the I/O loop.
# Checked here, at queue depth 1 (every request inline) and, on a
# second mapper with -D mapper.inline_off=1, through the loop:
#  - requests go inline, and are counted (nbdmsetup status --backends);
#    with inline_off, none is;
#  - a server that stalls past remote-timeout: the request fails with
#    EIO, the log says so, the connection comes back;
#  - a server killed while the request waits: it is retried on a new
#    connection and returns the data, and the write acknowledged inline
#    before counts as lost (the next flush fails with EIO once);
#  - a server that closes partway through a read's data: the read is
#    retried and returns the data (inline and through the loop);
#  - a reply to a write still being sent (the server rejects it early
#    and closes): the connection goes, named in the log, and the write
#    is retried and lands (inline and through the loop);
#  - an inline read retried after its connection closed keeps the
#    deadline it had inline: it fails (no server) before a read sent
#    through the loop 2 s after it, not 2 s after that.
# The first mapper's inline requests poll for their replies with
# remote-poll-max-us=$INLINE_POLL_US (0 here: none is polled, and every
# fault above is met asleep in poll(); test-remote-inline-poll.sh runs it
# all again polling, and checks that replies were polled for).
source "${top_srcdir:-$(dirname "$0")/..}/tests/functions.sh"

requires nbdkit --version
requires python3 -c 'import nbd'
requires timeout --version
requires fio --enghelp=nbd
poll_us=${INLINE_POLL_US:-0}

f=$(mkfile r.img 64M)
start_server r file "$f"
mkdir "$tmpdir/ctl"
# proxy: nbd_proxy.py on p.sock in front of r (its control files in ctl).
proxy ()
{
    rm -f "$tmpdir/p.sock" "$tmpdir/ctl/ready"
    python3 "$top_srcdir/tests/nbd_proxy.py" "$tmpdir/p.sock" \
        "$tmpdir/r.sock" "$tmpdir/ctl" &
    proxy=$!
    wait_for test -e "$tmpdir/ctl/ready" || die "the proxy did not start"
}
proxy
cleanup_fn 'kill $proxy'

echo "0 131072 linear nbd+unix:///?socket=$tmpdir/r.sock 0" > "$tmpdir/d.table"
echo "0 131072 linear nbd+unix:///?socket=$tmpdir/p.sock 0" > "$tmpdir/p.table"
# slow: a server whose reads take 5 ms, so that at iodepth 64 requests are
# in flight together however slowly the client runs; d2 a device over it;
# s 1 MiB of it whose every 8K is two clones, its 4K halves swapped (so
# never merged into one).
fq=$(mkfile slow.img 64M)
start_server slow --filter=delay file "$fq" delay-read=5ms
echo "0 131072 linear nbd+unix:///?socket=$tmpdir/slow.sock 0" > "$tmpdir/d2.table"
for k in $(seq 0 127); do
    echo "$((k * 16)) 8 linear nbd+unix:///?socket=$tmpdir/slow.sock $((k * 16 + 8))"
    echo "$((k * 16 + 8)) 8 linear nbd+unix:///?socket=$tmpdir/slow.sock $((k * 16))"
done > "$tmpdir/s.table"
log=$tmpdir/m.log
start_server --stderr "$log" m -v -D nbdkit.backend.datapath=0 -t 16 \
    mapper remote-connections=4 remote-timeout=3 \
    remote-poll-max-us="$poll_us" "$tmpdir/d.table" "$tmpdir/p.table" \
    "$tmpdir/d2.table" "$tmpdir/s.table"
llog=$tmpdir/l.log
start_server --stderr "$llog" l -v -D nbdkit.backend.datapath=0 \
    -D mapper.inline_off=1 -t 16 \
    mapper remote-connections=4 remote-timeout=3 "$tmpdir/p.table"
# sh SERVER DEVICE SCRIPT: nbdsh on DEVICE of mapper SERVER (m or l).
sh_on () { timeout 120 nbdsh -u "nbd+unix:///$2?socket=$tmpdir/$1.sock" -c "$3"; }
# inlined SERVER SOCK: requests done inline on backend SOCK of SERVER
# (listed once per device using it: d and s share r's).
inlined ()
{
    backend_status "$1" || die "nbdmsetup status failed"
    sed -nE "s|.*$2.*, ([0-9]+) inline.*|\1|p" "$tmpdir/status.out" |
        head -n 1 | grep . || { cat "$tmpdir/status.out"; die "no inline count for $2"; }
}
# polled SERVER SOCK: of them, those whose reply was polled for.
polled ()
{
    inlined "$1" "$2" > /dev/null
    sed -nE "s|.*$2.* inline \(([0-9]+) polled.*|\1|p" "$tmpdir/status.out" |
        head -n 1 | grep . || { cat "$tmpdir/status.out"; die "no polled count for $2"; }
}
# downs LOG SOCK PATTERN: connections of backend SOCK dropped, saying
# PATTERN (grep -E).
downs () { grep -E "$2[^:]*: connection [0-9]+ up -> down: $3" "$1" | wc -l; }
# up_again LOG SOCK N: backend SOCK had more than N connections come up.
up_again ()
{
    wait_for sh -c "[ \$(grep -Ec '$2[^:]*: connection [0-9]+ -> up' '$1') -gt $3 ]" ||
        die "$2: no connection came back"
}
ups () { grep -Ec "$2[^:]*: connection [0-9]+ -> up" "$1"; }

# --- requests go inline ---------------------------------------------------
sh_on m d 'h.pread(512, 0)'             # every connection up
wait_for sh -c "[ \$(grep -c 'r.sock.*: connection [0-9]* -> up' '$log') -ge 4 ]" ||
    die "not every connection came up"
before=$(inlined m r.sock)
pbefore=$(polled m r.sock)
sh_on m d '
for i in range(100):
    h.pwrite(bytes([i]) * 4096, i * 8192)
    assert h.pread(4096, i * 8192) == bytes([i]) * 4096, i
h.flush()
' || die "QD1 reads and writes failed"
after=$(inlined m r.sock)
[ "$after" -ge $((before + 201)) ] ||
    { cat "$tmpdir/status.out"; die "only $((after - before)) of 201 requests went inline"; }
# Polled: after the first reply the window opens (and only a reply later
# than remote-poll-max-us, 100 ms, would narrow it).  No count of those
# caught by polling: that depends on time.
pafter=$(polled m r.sock)
if [ "$poll_us" = 0 ]; then
    [ "$pafter" -eq 0 ] || { cat "$tmpdir/status.out"; die "polled with remote-poll-max-us=0"; }
else
    [ "$pafter" -gt "$pbefore" ] ||
        { cat "$tmpdir/status.out"; die "remote-poll-max-us=$poll_us: no reply polled for"; }
fi
cmp -n 4096 -i 8192:0 "$f" <(head -c 4096 /dev/zero | tr '\0' '\1') ||
    die "an inline write did not reach the server"
# A deep queue stays the loop's: at iodepth 64 over slow (5 ms a read) a
# request comes with others in flight, even when the loop's count of
# commands is 0 for a moment, so none goes inline (a first may).  Then
# alone again: after INLINE_CALM (32) requests through the loop, inline
# again.  Before, 398 of 1,280 reads in bursts of 64 went inline.
# deep DEVICE BS SIZE: 1,280 random reads of BS bytes at iodepth 64 from
# the first SIZE of DEVICE (fio wraps around it).
deep ()
{
    timeout 120 fio --name=deep --ioengine=nbd \
        --uri="nbd+unix:///$1?socket=$tmpdir/m.sock" --rw=randread \
        --bs="$2" --size="$3" --io_size=$((1280 * $2)) --iodepth=64 \
        --output="$tmpdir/fio.out" || { cat "$tmpdir/fio.out"; die "fio on $1 failed"; }
}
# alone N: N 4K reads, one at a time, of d2; prints how many went inline.
alone ()
{
    local before after
    before=$(inlined m slow.sock)
    sh_on m d2 "for i in range($1): h.pread(4096, i * 8192)" || die "QD1 reads failed"
    after=$(inlined m slow.sock)
    echo $((after - before))
}
sh_on m d2 'h.pread(512, 0)'            # every connection of slow up
wait_for sh -c "[ \$(grep -c 'slow.sock.*: connection [0-9]* -> up' '$log') -ge 4 ]" ||
    die "not every connection of slow came up"
[ "$(alone 4)" -ge 3 ] || { cat "$tmpdir/status.out"; die "slow: QD1 reads did not go inline"; }
before=$(inlined m slow.sock)
deep d2 4096 32M
after=$(inlined m slow.sock)
[ "$after" -le $((before + 2)) ] ||
    { cat "$tmpdir/status.out"; die "$((after - before)) of 1280 requests at depth 64 went inline"; }
n=$(alone 64)
[ "$n" -ge 28 ] && [ "$n" -le 34 ] ||
    { cat "$tmpdir/status.out"; die "alone again: $n of 64 went inline (32 expected)"; }
# Clones that could not go inline count as depth too: 8K reads of s,
# two clones on slow each, at iodepth 64 (over 1 MiB: fio keeps one read of
# a block in flight at a time); then of 64 reads alone, the first 32 go
# through the loop.
deep s 8192 1M
n=$(alone 64)
[ "$n" -ge 28 ] && [ "$n" -le 34 ] ||
    { cat "$tmpdir/status.out"; die "after split reads at depth: $n of 64 went inline (32 expected)"; }
sh_on l p 'h.pwrite(b"L" * 4096, 0); assert h.pread(4096, 0) == b"L" * 4096' ||
    die "through the loop: failed"
[ "$(inlined l p.sock)" -eq 0 ] || die "inline_off: a request went inline"
# Every connection of l up: its faults below are on direct ones.
wait_for sh -c "[ \$(grep -c 'p.sock.*: connection [0-9]* -> up' '$llog') -ge 4 ]" ||
    die "not every connection of l came up"

# --- a server stalling past remote-timeout --------------------------------
sh_on m p 'h.pread(512, 0)'
wait_for sh -c "[ \$(grep -c 'p.sock.*: connection [0-9]* -> up' '$log') -ge 4 ]" ||
    die "not every connection of p came up"
n=$(ups "$log" p.sock)
for i in $(seq 0 15); do touch "$tmpdir/ctl/freeze-$i"; done
sh_on m p '
from nbdcheck import fails_eio
assert fails_eio(h.pread, 4096, 0), "a read from a stalled server worked"
' || die "stall: the read did not fail with EIO"
rm -f "$tmpdir"/ctl/freeze-*
[ "$(downs "$log" p.sock 'request timed out \(server stalled\) \(inline\)')" -eq 1 ] ||
    { grep 'up -> down' "$log"; die "stall: the log does not name an inline timeout"; }
sh_on m p 'assert h.pread(4096, 0) == b"L" * 4096' ||
    { grep 'up -> down' "$log"; die "stall: the next read failed"; }
up_again "$log" p.sock "$n"

# --- the server killed while a request waits -------------------------------
# A write acknowledged (inline) and not flushed; then a read reaches a
# frozen proxy, which is killed and started again: the read is retried
# on a new connection, and the write counts as lost.
n=$(ups "$log" p.sock)
sh_on m p 'h.flush(); h.pwrite(b"K" * 4096, 4096)' || die "kill: the write failed"
rm -f "$tmpdir"/ctl/held-*
for i in $(seq 0 31); do touch "$tmpdir/ctl/freeze-$i"; done
sh_on m p '
from nbdcheck import fails_eio
assert h.pread(4096, 4096) == b"K" * 4096, "the read after the kill"
assert fails_eio(h.flush), "the flush after a lost connection worked"
assert not fails_eio(h.flush), "the second flush failed"
' &
reader=$!
wait_for sh -c "ls '$tmpdir'/ctl/held-* >/dev/null 2>&1" ||
    die "kill: the read did not reach the proxy"
kill $proxy; wait $proxy 2>/dev/null || :
rm -f "$tmpdir"/ctl/freeze-* "$tmpdir"/ctl/frozen-*
proxy
wait $reader || die "kill: the read or the flushes went wrong"
[ "$(downs "$log" p.sock 'the server closed the connection \(inline\)')" -ge 1 ] ||
    { grep 'up -> down' "$log"; die "kill: the log does not name the closed connection"; }
up_again "$log" p.sock "$n"

# --- a server closing partway through a read's data ----------------------
# cut SERVER LOG PATTERN: the read's reply stops after 100 bytes of its
# data and the connection closes; the read is retried, returns the data,
# and the log names the fault (PATTERN).
cut ()
{
    local was
    sh_on "$1" p 'h.pwrite(b"C" * 4096, 65536)' || die "cut: the write failed"
    was=$(downs "$2" p.sock "$3")
    touch "$tmpdir/ctl/cut"
    sh_on "$1" p '
import os
assert h.pread(4096, 65536) == b"C" * 4096
assert not os.path.exists("'"$tmpdir"'/ctl/cut"), "nothing cut"
' || die "cut ($1): the read went wrong"
    [ "$(downs "$2" p.sock "$3")" -eq $((was + 1)) ] ||
        { grep 'up -> down' "$2"; die "cut ($1): the log does not say /$3/"; }
}
cut m "$log" 'the server closed the connection \(inline\)'
cut l "$llog" 'the server closed the connection$'

# --- a reply to a write still being sent ----------------------------------
# early SERVER LOG PATTERN: a 1 MiB write gets an EIO reply as soon as its
# header arrives, and the connection closes: the write is retried and
# lands; the log names the fault (PATTERN).
early ()
{
    local was
    was=$(downs "$2" p.sock "$3")
    touch "$tmpdir/ctl/early"
    sh_on "$1" p '
import os
h.pwrite(b"'"$4"'" * (1 << 20), 1 << 20)
assert not os.path.exists("'"$tmpdir"'/ctl/early"), "nothing rejected"
assert h.pread(1 << 20, 1 << 20) == b"'"$4"'" * (1 << 20)
' || die "early ($1): the write went wrong"
    [ "$(downs "$2" p.sock "$3")" -eq $((was + 1)) ] ||
        { grep 'up -> down' "$2"; die "early ($1): the log does not say /$3/"; }
}
early m "$log" 'send: .* \(inline\)$' E
early l "$llog" 'reply to a request still being sent \(cookie 0x[0-9a-f]{16}, error 5\)' F

# --- a retried inline request keeps its deadline --------------------------
# Mapper q (remote-timeout=8) on the proxy, all frozen: R1, a read alone,
# goes inline; 2 s later R2, a read over both of q's targets (two clones,
# the loop's: the targets are not contiguous on the backend, or io_emit
# would make them one clone, which goes inline too and, given a fresh
# deadline as well, ties with R1); 2 s later the proxy goes for good.  Both are retried,
# find no server, and fail at their deadlines: R1's is the one it had
# inline, 2 s before R2's.  (It was given a fresh one when the loop took
# it over, 2 s after R2's.)
kill $proxy; wait $proxy 2>/dev/null || :
rm -f "$tmpdir"/ctl/*
proxy
echo "0 2048 linear nbd+unix:///?socket=$tmpdir/p.sock 0
2048 2048 linear nbd+unix:///?socket=$tmpdir/p.sock 8192" > "$tmpdir/q.table"
qlog=$tmpdir/q.log
start_server --stderr "$qlog" q -v -D nbdkit.backend.datapath=0 -t 16 \
    mapper remote-connections=4 remote-timeout=8 \
    remote-poll-max-us="$poll_us" "$tmpdir/q.table"
sh_on q q 'h.pread(512, 0)'
wait_for sh -c "[ \$(grep -c 'p.sock.*: connection [0-9]* -> up' '$qlog') -ge 4 ]" ||
    die "deadline: not every connection of q came up"
sh_on q q 'h.pread(512, 0); h.pread(512, 0)' || die "deadline: reads failed"
[ "$(inlined q p.sock)" -ge 1 ] || die "deadline: nothing went inline"
for i in $(seq 0 15); do touch "$tmpdir/ctl/freeze-$i"; done
rm -f "$tmpdir/order"
req ()  # NAME OFFSET LENGTH: a read on q expected to fail with EIO
{
    sh_on q q "
from nbdcheck import fails_eio
assert fails_eio(h.pread, $3, $2), '$1 worked'
" && echo "$1" >> "$tmpdir/order"
}
held () { ls "$tmpdir"/ctl/held-* 2>/dev/null | wc -l; }
req R1 0 4096 &
r1=$!
wait_for sh -c "[ \$(ls '$tmpdir'/ctl/held-* 2>/dev/null | wc -l) -ge 1 ]" ||
    die "deadline: R1 did not reach the proxy"
sleep 2
n=$(held)
req R2 $((2048 * 512 - 4096)) 8192 &
r2=$!
wait_for sh -c "[ \$(ls '$tmpdir'/ctl/held-* 2>/dev/null | wc -l) -gt $n ]" ||
    die "deadline: R2 did not reach the proxy"
sleep 2
kill $proxy; wait $proxy 2>/dev/null || :
wait $r1 || die "deadline: R1 did not fail with EIO"
wait $r2 || die "deadline: R2 did not fail with EIO"
grep -q 'the server closed the connection (inline)' "$qlog" ||
    die "deadline: R1 was not inline when the server went"
[ "$(head -1 "$tmpdir/order")" = R1 ] ||
    { cat "$tmpdir/order"; die "deadline: R2 failed first: R1 got a new deadline"; }

echo "$0: ok"
