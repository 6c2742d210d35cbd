#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# A remote server that restarts loses the writes acknowledged on every
# connection, not only on the connection found dead first.  Here the
# connection holding the write (1) is found dead late (a proxy keeps it
# open but silent, as after a host crash or a partition, until its
# requests time out), the other (0) at once: it reconnects to the new
# server and takes the next flush.  That flush must fail with EIO: the
# write it "covers" went with the old server.  (The loss counted only a
# connection's own acknowledged writes: the flush succeeded, and the
# write was gone.)
source "${top_srcdir:-$(dirname "$0")/..}/tests/functions.sh"

requires nbdkit --version
requires nbdkit memory --version
requires python3 -c 'import nbd'
requires timeout --version

start_server r memory 16M            # forgets everything when it restarts

# The proxy: p.sock -> r.sock, one pair of threads per connection, in
# accept order (0, 1, ...).  A file ctl/freeze-N makes connection N
# silent: what the client sends is read and counted (ctl/held-N), never
# forwarded, nothing comes back, and the client's socket stays open
# (ctl/frozen-N says it is).
# ctl/sent-N: bytes connection N forwarded to the server.
mkdir "$tmpdir/ctl"
python3 "$top_srcdir/tests/nbd_proxy.py" "$tmpdir/p.sock" "$tmpdir/r.sock" "$tmpdir/ctl" &
proxy=$!
cleanup_fn "kill_job $proxy"
wait_for test -e "$tmpdir/ctl/ready" || die "the proxy did not start"

echo "0 32768 linear nbd+unix:///?socket=$tmpdir/p.sock 0" > "$tmpdir/d.table"
sock=$tmpdir/mapper.sock
log=$tmpdir/mapper.log
# Threads enough for the 32 reads below to reach the backend at once.
# Every request through the I/O loop (inline_off): the test places them
# by the loop's rule (connection 1 first, up to SPILL), and an inline
# read would hold connection 1 alone until its timeout.  The same loss
# after an inline write: test-remote-inline.sh.
start_server --stderr "$log" mapper -v -D nbdkit.backend.datapath=0 -t 64 \
    -D mapper.inline_off=1 mapper remote-connections=2 remote-timeout=4 "$tmpdir/d.table"

timeout 120 python3 "$top_srcdir/tests/remote_loss_elsewhere.py" "$sock" "$tmpdir" || { grep 'p.sock' "$log" | tail -20; die "failed"; }
echo "$0: ok"
