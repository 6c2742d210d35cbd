#!/usr/bin/env bash
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
source "$top_srcdir/tests/remote-functions.sh"

requires nbdkit --version
requires python3 -c 'import nbd'
requires nbdcopy --version
requires fio --version
requires sh -c 'fio --enghelp=nbd 2>&1 | grep -q uri'
requires ip -V
requires timeout --version

nsa=nbdm-a-$$ nsb=nbdm-b-$$
addr_a=10.77.0.1 addr_b=10.77.0.2 port=10809   # private to the namespaces

netns_new "$nsa"
netns_new "$nsb"
netns_skip "create a veth pair" \
    ip -n "$nsa" link add va type veth peer name vb netns "$nsb"
ip -n "$nsa" addr add "$addr_a/30" dev va
ip -n "$nsb" addr add "$addr_b/30" dev vb
ip -n "$nsa" link set va up
ip -n "$nsb" link set vb up

# link NS DEV up|down
link () { ip -n "$1" link set "$2" "$3"; }

# The backend, in B on its veth address only.
f=$(mkfile remote.img 16M)
ip netns exec "$nsb" nbdkit -i "$addr_b" -p "$port" -P "$tmpdir/r.pid" \
    file "$f" || die "backend: nbdkit file failed"
# SIGKILL: connections that lived through a cut link still have data
# and their FIN queued behind a backed-off retransmission timer when the
# mapper closes them (ss shows FIN-WAIT-1 on the mapper's side,
# ESTABLISHED here), so the backend hears of their end only minutes
# later, and nbdkit 1.32 waits at exit for its clients to go.  It is not
# the server under test (the mapper is stopped with SIGTERM).
cleanup_fn "kill_backend r KILL"
wait_file "$tmpdir/r.pid"

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
    rm -f "$sock" "$tmpdir/mapper.pid"
    MAPPER_NETNS=$nsa mapper -v -D nbdkit.backend.datapath=0 \
        -U "$sock" -P "$tmpdir/mapper.pid" remote-timeout="$1" \
        "$tmpdir/remote.table" "$tmpdir/local.table" 2> "$2" ||
        { cat "$2"; die "nbdkit mapper failed to start"; }
}
stop_mapper () { stop_pidfile "$tmpdir/mapper.pid"; }
cleanup_fn stop_mapper

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
cat > "$tmpdir/down.py" <<'EOF'
import errno, os, re, subprocess, sys, time
import nbd
from nbdcheck import aio_wait, connect, fails_eio as eio, when_back
sock, nsa, img, pidfile, log = sys.argv[1:6]
timeout = int(sys.argv[6])
nbdmsetup = sys.argv[7]

def backend_state():
    """nbdmsetup status --backends: the remote backend's state line."""
    out = subprocess.run([nbdmsetup, "-c",
                          "nbd+unix:///control?socket=%s" % sock,
                          "status", "--backends", "remote"],
                         check=True, capture_output=True, text=True).stdout
    lines = [l for l in out.splitlines() if l.startswith("nbd ")]
    assert len(lines) == 1, out
    return lines[0]

def conn(name):
    return connect(sock, name)

def link(state):
    subprocess.check_call(["ip", "-n", nsa, "link", "set", "va", state])

def log_text():
    with open(log) as fp:
        return fp.read()

def dropped():
    return set(re.findall(r"connection (\d+) up -> down: request timed out",
                          log_text()))

nconns = int(re.search(r"(\d+) connections?;", log_text()).group(1))
r, loc = conn("remote"), conn("local")
r.pwrite(b"F" * 65536, 0)
r.flush()
for i in range(600):            # every connection up before the cut
    if len(re.findall(r"connection \d+ -> up", log_text())) >= nconns:
        break
    time.sleep(0.1)
else:
    raise AssertionError("not all %d connections came up" % nconns)
r.pwrite(b"U" * 4096, 65536)    # acknowledged, never flushed (case 3)

link("down")
# A read and a write in flight on the cut-off backend while the local
# device serves; both end with EIO.
rd = r.aio_pread(nbd.Buffer(4096), 0)
wr = r.aio_pwrite(nbd.Buffer.from_bytearray(bytearray(b"W" * 4096)), 69632)
for i in range(32):
    loc.pwrite(bytes([97 + i % 26]) * 512, i * 512)
for i in range(32):
    assert loc.pread(512, i * 512) == bytes([97 + i % 26]) * 512
loc.flush()
assert aio_wait(r, rd) == errno.EIO, "read over a cut link did not fail with EIO"
assert aio_wait(r, wr) == errno.EIO, "write over a cut link did not fail with EIO"
print("cut link: read and write failed with EIO")
# Each connection looks up until a request on it stalls: read until
# every one was dropped.
for i in range(2 * nconns):
    if len(dropped()) == nconns:
        break
    assert eio(r.pread, 4096, 0), "a read worked with the link down"
assert len(dropped()) == nconns, "dropped: %s" % sorted(dropped())
print("cut link: all %d connections dropped as stalled" % nconns)
# No connection for longer than remote-timeout, and reconnects fail at
# once: requests fail at once, none waits for a connection any more.
time.sleep(timeout + 1)
mark = len(log_text())
for i in range(5):
    assert eio(r.pread, 4096, 0), "a read worked with the link down"
    assert eio(r.pwrite, b"X" * 512, 1 << 20), "a write worked"
assert "waiting for a connection" not in log_text()[mark:], \
    "requests still wait for a connection of a backend known to be down"
# The server is up: new clients connect, the local device works.
loc2 = conn("local")
assert loc2.pread(512, 0) == b"a" * 512
loc2.shutdown()
os.kill(int(open(pidfile).read()), 0)
print("cut link: a backend known down fails at once; the local device works")
st = backend_state()
assert re.search(r": 0/%d connections up \(down for [0-9.]+s, reconnecting\)" % nconns,
                 st), st
assert not re.search(r", 0 connections lost", st), st
print("nbdmsetup status --backends:", st)

link("up")
# Back: the device works again once a connection is up (bounded wait).
data = when_back(r.pread, 4096, 65536,
                 what="the device did not come back after the link did")
assert data == b"U" * 4096
assert r.pread(65536, 0) == b"F" * 65536
print("link restored: the device reads again")
st = backend_state()
assert re.search(r": [1-9][0-9]*/%d connections up, " % nconns, st), st
print("nbdmsetup status --backends:", st)

# 3. The "U" write was acknowledged, not flushed, when the connection went.
assert eio(r.flush), "flush after a lost connection succeeded"
r.flush()                       # once only
r.pwrite(b"V" * 4096, 73728)
r.flush()
r.shutdown()
loc.shutdown()
with open(img, "rb") as fp:
    fp.seek(65536)
    assert fp.read(4096) == b"U" * 4096
    fp.seek(73728)
    assert fp.read(4096) == b"V" * 4096
print("flush after the lost connection: EIO once, then fine")
EOF
log=$tmpdir/mapper2.log
: "${NBDMSETUP:=$top_builddir/client-tools/nbdmsetup/nbdmsetup}"
timeout 300 python3 "$tmpdir/down.py" "$sock" "$nsa" "$f" "$tmpdir/mapper.pid" \
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
