#!/usr/bin/env bash
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
source "$top_srcdir/tests/remote-functions.sh"

requires nbdkit --version
requires python3 -c 'import nbd'
requires ip -V

ns=nbdm-dns-$$
netns_new "$ns"
netns_skip "write /etc/netns" mkdir -p "/etc/netns/$ns"
cleanup_fn "rm -rf '/etc/netns/$ns'"
printf 'nameserver 127.0.0.1\noptions timeout:30 attempts:1\n' \
    > "/etc/netns/$ns/resolv.conf"

cat > "$tmpdir/dns.py" <<'EOF'
# A DNS server for one name, on 127.0.0.1:53.
import os, select, socket, struct, sys
d = sys.argv[1]
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("127.0.0.1", 53))
open(d + "/dns.ready", "w").write("ready\n")

def answer(q, addr):
    qid = struct.unpack(">H", q[:2])[0]
    i, labels = 12, []
    while q[i]:
        labels.append(q[i + 1:i + 1 + q[i]].decode().lower())
        i += 1 + q[i]
    qtype = struct.unpack(">H", q[i + 1:i + 3])[0]
    question = q[12:i + 5]
    ours = ".".join(labels) == "backend.test"
    if ours and qtype == 1:             # A: 127.0.0.1
        rr = b"\xc0\x0c" + struct.pack(">HHIH", 1, 1, 0, 4) + \
            socket.inet_aton("127.0.0.1")
        hdr = struct.pack(">HHHHHH", qid, 0x8180, 1, 1, 0, 0)
    else:                               # no such record / no such name
        hdr = struct.pack(">HHHHHH", qid, 0x8180 | (0 if ours else 3),
                          1, 0, 0, 0)
        rr = b""
    s.sendto(hdr + question + rr, addr)

held = []
while True:
    if select.select([s], [], [], 0.05)[0]:
        held.append(s.recvfrom(512))
    if os.path.exists(d + "/hold"):
        if held and not os.path.exists(d + "/held"):
            open(d + "/held", "w").close()      # a query is waiting
        continue
    for q, addr in held:
        answer(q, addr)
    held = []
EOF
ip netns exec "$ns" python3 "$tmpdir/dns.py" "$tmpdir" &
dns=$!
cleanup_fn "kill $dns"
wait_file "$tmpdir/dns.ready"

# The backend behind the host name, in the namespace; lookup.py starts
# it again with the same command.
slow_server="ip netns exec $ns nbdkit -i 127.0.0.1 -p 10809 -P $tmpdir/slow.pid memory 1M"
$slow_server || die "backend slow: nbdkit failed"
cleanup_fn "kill_backend slow"
wait_file "$tmpdir/slow.pid"
backend fast memory 1M

echo "0 2048 linear nbd://backend.test/ 0" > "$tmpdir/slow.table"
echo "0 2048 linear nbd+unix:///?socket=$tmpdir/fast.sock 0" \
    > "$tmpdir/fast.table"
MAPPER_NETNS=$ns mapper -U "$tmpdir/m.sock" -P "$tmpdir/m.pid" \
    remote-connections=1 remote-timeout=60 \
    "$tmpdir/slow.table" "$tmpdir/fast.table" ||
    die "the mapper did not start (table load looks backend.test up)"
cleanup_fn 'stop_pidfile "$tmpdir/m.pid"'

cat > "$tmpdir/lookup.py" <<'EOF'
import os, signal, subprocess, sys, time
import nbd
from nbdcheck import aio_wait, connect, when_back
d, restart = sys.argv[1], sys.argv[2]
sock = d + "/m.sock"
fast, slow = connect(sock, "fast"), connect(sock, "slow")

# 1. Both work.
fast.pwrite(b"f" * 4096, 0)
slow.pwrite(b"s" * 4096, 0)
assert fast.pread(4096, 0) == b"f" * 4096
assert slow.pread(4096, 0) == b"s" * 4096
print("1: both devices work")

# 2. The DNS server holds queries; slow's server goes away.
open(d + "/hold", "w").close()
os.kill(int(open(d + "/slow.pid").read()), signal.SIGKILL)
for _ in range(300):
    if os.path.exists(d + "/held"):
        break
    time.sleep(0.1)
else:
    raise AssertionError("the mapper never looked backend.test up again")
print("2: the reconnect's lookup of backend.test is held")

# 3. fast still serves while the lookup is held; a read on slow waits
#    for the name (remote-timeout=60: it neither fails nor completes).
sbuf = nbd.Buffer(4096)
scookie = slow.aio_pread(sbuf, 0)
buf = nbd.Buffer(4096)
cookie = fast.aio_pread(buf, 0)
assert aio_wait(fast, cookie, 20,
                "fast stalled while a host name was being looked up") == 0
assert buf.to_bytearray() == b"f" * 4096
assert os.path.exists(d + "/hold") and os.path.exists(d + "/held")
slow.poll(500)                  # take in a reply, if there is one
assert not slow.aio_command_completed(scookie), \
    "a read on slow completed while its host name was held"
print("3: fast served a read while the lookup was held; slow's read waits")

# 4. Answers again, the server is back: slow works (empty: memory), the
#    waiting read included.
os.unlink(d + "/hold")
subprocess.check_call(["sh", "-c", restart])
assert aio_wait(slow, scookie, 60, "slow's waiting read never completed") == 0
assert sbuf.to_bytearray() == bytes(4096)
when_back(slow.pread, 4096, 0, seconds=60)
slow.pwrite(b"t" * 4096, 0)
assert slow.pread(4096, 0) == b"t" * 4096
print("4: slow is back")
EOF
cd "$tmpdir"
timeout 300 python3 "$tmpdir/lookup.py" "$tmpdir" "$slow_server" ||
    die "a held DNS lookup"
stop_pidfile "$tmpdir/m.pid"
echo "test-remote-lookup: ok"
