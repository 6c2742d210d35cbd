#!/usr/bin/env bash
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
source "$top_srcdir/tests/remote-functions.sh"

requires nbdkit --version
requires nbdkit memory --version
requires python3 -c 'import nbd'
requires timeout --version

backend r memory 16M            # forgets everything when it restarts

# The proxy: p.sock -> r.sock, one pair of threads per connection, in
# accept order (0, 1, ...).  A file ctl/freeze-N makes connection N
# silent: what the client sends is read and counted (ctl/held-N), never
# forwarded, nothing comes back, and the client's socket stays open
# (ctl/frozen-N says it is).
# ctl/sent-N: bytes connection N forwarded to the server.
mkdir "$tmpdir/ctl"
cat > "$tmpdir/proxy.py" <<'PYEOF'
import os, select, socket, sys, threading
listen, target, ctl = sys.argv[1:4]

def put(name, value):
    tmp = os.path.join(ctl, "." + name)
    with open(tmp, "w") as f:
        f.write("%d\n" % value)
    os.rename(tmp, os.path.join(ctl, name))

def serve(n, c):
    try:
        s = socket.socket(socket.AF_UNIX)
        s.connect(target)
    except OSError:
        c.close()
        return
    sent = held = 0
    while True:
        frozen = os.path.exists(os.path.join(ctl, "freeze-%d" % n))
        r, _, _ = select.select([c] if frozen else [c, s], [], [], 0.05)
        if frozen:
            if not os.path.exists(os.path.join(ctl, "frozen-%d" % n)):
                put("frozen-%d" % n, 1)
            if c in r:
                d = c.recv(65536)
                if not d:
                    break
                held += len(d)
                put("held-%d" % n, held)
            continue
        done = False
        for x in r:
            d = x.recv(65536)
            if not d:
                done = True
                break
            (s if x is c else c).sendall(d)
            if x is c:
                sent += len(d)
                put("sent-%d" % n, sent)
        if done:
            break
    for x in (c, s):
        try:
            x.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        x.close()

l = socket.socket(socket.AF_UNIX)
l.bind(listen)
l.listen(16)
open(os.path.join(ctl, "ready"), "w").close()
n = 0
while True:
    c, _ = l.accept()
    threading.Thread(target=serve, args=(n, c), daemon=True).start()
    n += 1
PYEOF
python3 "$tmpdir/proxy.py" "$tmpdir/p.sock" "$tmpdir/r.sock" "$tmpdir/ctl" &
proxy=$!
cleanup_fn "kill $proxy"
wait_for test -e "$tmpdir/ctl/ready" || die "the proxy did not start"

echo "0 32768 linear nbd+unix:///?socket=$tmpdir/p.sock 0" > "$tmpdir/d.table"
sock=$tmpdir/mapper.sock
log=$tmpdir/mapper.log
# Threads enough for the 32 reads below to reach the backend at once.
mapper -v -D nbdkit.backend.datapath=0 -t 64 -U "$sock" \
    -P "$tmpdir/mapper.pid" remote-connections=2 remote-timeout=4 \
    "$tmpdir/d.table" 2> "$log"
cleanup_fn 'stop_pidfile "$tmpdir/mapper.pid"'

timeout 120 python3 - "$sock" "$tmpdir" <<'PYEOF' || { grep 'p.sock' "$log" | tail -20; die "failed"; }
import os, signal, subprocess, sys, time
import nbd
from nbdcheck import aio_wait, connect, fails_eio

sock, d = sys.argv[1:3]
ctl = d + "/ctl"

def value(name):
    try:
        return int(open(os.path.join(ctl, name)).read())
    except FileNotFoundError:
        return 0

def ups(i):
    return open(d + "/mapper.log").read().count("connection %d -> up" % i)

def until(cond, what):
    deadline = time.monotonic() + 60
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)

h = connect(sock)
h.pwrite(b"A" * 4096, 0)
h.flush()
until(lambda: ups(0) >= 1 and ups(1) >= 1, "the connections did not come up")
# Reads and writes go to connection 1 first (pick_conn).
before = value("sent-1")
h.pwrite(b"W" * 4096, 8192)                 # acknowledged, not flushed
assert value("sent-1") - before >= 4096, "the write did not go to connection 1"

# Connection 1 goes silent, the server restarts: connection 0 is found
# dead at once and reconnects to the new server.
open(ctl + "/freeze-1", "w").close()
until(lambda: value("frozen-1"), "the proxy did not freeze connection 1")
pid = int(open(d + "/r.pid").read())
os.kill(pid, signal.SIGKILL)
while os.path.exists("/proc/%d" % pid) and \
        open("/proc/%d/stat" % pid).read().split()[2] != "Z":
    time.sleep(0.05)
os.unlink(d + "/r.sock")
subprocess.check_call(["nbdkit", "-U", d + "/r.sock", "-P", d + "/r.pid",
                       "memory", "16M"])
until(lambda: ups(0) >= 2, "connection 0 did not come back")

# Fill connection 1 (32 commands, SPILL) so that the flush goes to
# connection 0, the new server.
bufs = [nbd.Buffer(4096) for i in range(32)]
cookies = [h.aio_pread(b, (64 + i) * 4096) for i, b in enumerate(bufs)]
until(lambda: value("held-1") >= 32 * 28, "the reads did not reach "
      "connection 1")
assert fails_eio(h.flush), \
    "flush succeeded, but the write acknowledged before it is gone"
for c in cookies:
    aio_wait(h, c)                          # retried on connection 0
lost = h.pread(4096, 8192) != b"W" * 4096
print("the write is %s" % ("gone, and the flush said so" if lost
                           else "still there"))
h.flush()
h.shutdown()
PYEOF
echo "$0: ok"
