# SPDX-License-Identifier: BSD-3-Clause
"""A proxy LISTEN -> TARGET (Unix sockets), one pair of threads per
connection, in accept order (0, 1, ...) (tests/test-remote-loss-elsewhere.sh).
A file CTL/freeze-N makes connection N silent: what the client sends is
read and counted (CTL/held-N), never forwarded, nothing comes back, and
the client's socket stays open (CTL/frozen-N says it is).  CTL/sent-N:
bytes connection N forwarded to the server.  A file CTL/corrupt holding
"magic", "cookie" or "gen" flips one byte (0, 15 or 11) of the next data
the server sends on any connection (at queue depth 1, a reply's header:
its magic, its cookie's low byte, or the low byte of its high half),
then goes.  A file CTL/cut makes the next data of the server longer than
a reply header and 100 bytes (a read's reply) arrive only in part (the
header and 100 bytes of the data), and then closes that connection: a
server gone partway through a read's data.  A file CTL/early makes the
next client data that starts a write of at least 256 KiB get an EIO
reply at once, before the rest of the write is read, and then closes
the connection: a reply to a request still being sent.  Both go once
used.

  python3 nbd_proxy.py LISTEN TARGET CTL
"""
import os, select, socket, struct, sys, threading
listen, target, ctl = sys.argv[1:4]

def put(name, value):
    tmp = os.path.join(ctl, "." + name)
    with open(tmp, "w") as f:
        f.write("%d\n" % value)
    os.rename(tmp, os.path.join(ctl, name))

def once(cond, name):
    """cond, and CTL/name was there (it is gone now)."""
    if not cond:
        return False
    try:
        os.unlink(os.path.join(ctl, name))
        return True
    except FileNotFoundError:
        return False

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
            # Looked at again now that data came: a request sent after
            # the test removed freeze-N (a select that began before the
            # removal) is forwarded, not held.
            if c in r and os.path.exists(os.path.join(ctl, "freeze-%d" % n)):
                d = c.recv(65536)
                if not d:
                    break
                held += len(d)
                put("held-%d" % n, held)
            continue
        done = False
        for x in r:
            try:
                d = x.recv(65536)
            except OSError:             # reset: the client dropped it
                d = b""
            if not d:
                done = True
                break
            if once(x is s and len(d) > 116, "cut"):
                c.sendall(d[:116])
                done = True
                break
            if x is c and len(d) >= 28:
                magic, _, typ, cookie, _, length = struct.unpack(
                    ">IHHQQI", d[:28])
                if once(magic == 0x25609513 and typ == 1 and
                        length >= 256 << 10, "early"):
                    c.sendall(struct.pack(">IIQ", 0x67446698, 5, cookie))
                    done = True
                    break
            corrupt = os.path.join(ctl, "corrupt")
            if x is s and os.path.exists(corrupt):
                with open(corrupt) as f:
                    at = {"magic": 0, "gen": 11}.get(f.read().strip(), 15)
                try:
                    os.unlink(corrupt)
                except FileNotFoundError:
                    at = len(d)         # another connection's
                if len(d) > at:
                    d = d[:at] + bytes([d[at] ^ 0x55]) + d[at + 1:]
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
