#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# A remote backend named by host name, and a DNS server that stops
# answering: reconnecting to that backend waits for the name, but the
# I/O loop does not, so another remote device keeps serving meanwhile.
#
# Everything runs in a network namespace made here, whose resolv.conf
# (/etc/netns/NAME/resolv.conf, bind-mounted by "ip netns exec") points
# at a small DNS server on the namespace's own 127.0.0.1:53 that answers
# "backend.test" with 127.0.0.1, or holds every query while the file
# $tmpdir/hold exists.  The backend "slow" listens on 127.0.0.1:10809 in
# the namespace; "fast" is on a Unix socket.
#
#  1. Both devices work (the table load looked backend.test up).
#  2. hold; slow's server is killed: the mapper reconnects, and its
#     lookup of backend.test is held by the DNS server.
#  3. While that query is held, a read on fast completes, and one on slow
#     waits.  (Before the resolver thread, libnbd's getaddrinfo ran in the
#     loop thread: every remote device stopped until the resolver gave
#     up, 30 s here.)
#  4. The DNS server answers again, slow's server comes back: the waiting
#     read completes, slow works.
#
# Skips (77) without iproute2, the right to make namespaces, or a
# writable /etc/netns.
source "${top_srcdir:-$(dirname "$0")/..}/tests/functions.sh"

requires nbdkit --version
requires python3 -c 'import nbd'
requires ip -V

ns=nbdm-dns-$$
netns_new "$ns"
netns_skip "write /etc/netns" mkdir -p "/etc/netns/$ns"
cleanup_fn "rm -rf '/etc/netns/$ns'"
printf 'nameserver 127.0.0.1\noptions timeout:30 attempts:1\n' \
    > "/etc/netns/$ns/resolv.conf"

ip netns exec "$ns" python3 "$top_srcdir/tests/fake_dns.py" "$tmpdir" &
dns=$!
cleanup_fn "kill_job $dns"
wait_file "$tmpdir/dns.ready"

# The backend behind the host name, in the namespace; lookup.py starts
# it again.
start_server --wrap "ip netns exec $ns" slow -i 127.0.0.1 -p 10809 memory 1M
start_server fast memory 1M

echo "0 2048 linear nbd://backend.test/ 0" > "$tmpdir/slow.table"
echo "0 2048 linear nbd+unix:///?socket=$tmpdir/fast.sock 0" \
    > "$tmpdir/fast.table"
# (Its tables' load looks backend.test up.)
start_server --wrap "ip netns exec $ns" m mapper \
    remote-connections=1 remote-timeout=60 \
    "$tmpdir/slow.table" "$tmpdir/fast.table"

cd "$tmpdir"
timeout 300 python3 "$top_srcdir/tests/remote_lookup.py" "$tmpdir" "$ns" ||
    die "a held DNS lookup"
stop_server m
echo "test-remote-lookup: ok"
