# SPDX-License-Identifier: BSD-3-Clause
"""A proxy LISTEN -> TARGET (Unix sockets) that replaces the bytes OLD
with NEW (same length: the response header gives the length) in what
the server sends, so that the client
sees a response the real server could send but does not: e.g. the rows
of status --backends in another order (test-nbdmsetup-rewrite.sh).
What comes from the server is held until it has been silent for 50 ms,
so that OLD is replaced even across two reads.  CTL/hits: how many
replacements were made.

  python3 rewrite_proxy.py LISTEN TARGET CTL OLD NEW   (\t, \n escapes)
"""
import os, select, socket, sys, threading
listen, target, ctl = sys.argv[1:4]
old, new = (a.encode().decode("unicode_escape").encode("latin-1")
            for a in sys.argv[4:6])
assert len(old) == len(new), "OLD and NEW must have the same length"
hits = 0
lock = threading.Lock()

def serve(c):
    global hits
    s = socket.socket(socket.AF_UNIX)
    s.connect(target)
    held = b""
    while True:
        r, _, _ = select.select([c, s], [], [], 0.05)
        if not r and held:
            n = held.count(old)
            if n:
                with lock:
                    hits += n
                    with open(os.path.join(ctl, ".hits"), "w") as f:
                        f.write("%d\n" % hits)
                    os.rename(os.path.join(ctl, ".hits"),
                              os.path.join(ctl, "hits"))
            c.sendall(held.replace(old, new))
            held = b""
        done = False
        for x in r:
            d = x.recv(65536)
            if not d:
                done = True
                break
            if x is c:
                s.sendall(d)
            else:
                held += d
        if done:
            break
    c.close()
    s.close()

l = socket.socket(socket.AF_UNIX)
l.bind(listen)
l.listen(16)
while True:
    c, _ = l.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
