# SPDX-License-Identifier: BSD-3-Clause
"""A remote backend's link cut and left down (tests/test-remote-netns.sh,
cases 2 and 3): remote reads and writes fail with EIO instead of
hanging, stalled connections are dropped, and once the backend has been
down for longer than remote-timeout requests fail at once; the local
device keeps working; once the link is back the device works again, and
the first flush after the loss of an unflushed write fails, once.

  python3 remote_netns.py UNIXSOCKET NS-A IMAGE PIDFILE LOG TIMEOUT NBDMSETUP
"""
import errno, os, re, subprocess, sys, time
import nbd
from nbdcheck import aio_wait, connect, fails_eio as eio, until, when_back
sock, nsa, img, pidfile, log = sys.argv[1:6]
timeout = int(sys.argv[6])
nbdmsetup = sys.argv[7]

def backend_state():
    """nbdmsetup status --backends: the remote backend's state line."""
    out = subprocess.run([nbdmsetup, "-a",
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
until(lambda: len(re.findall(r"connection \d+ -> up", log_text())) >= nconns,
      "not all %d connections came up" % nconns)   # before the cut
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
