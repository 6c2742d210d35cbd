# SPDX-License-Identifier: BSD-3-Clause
"""A DNS server for one name, on 127.0.0.1:53 (tests/test-remote-lookup.sh
runs it in a network namespace).  DIR/hold makes it hold queries
(DIR/held says one came); DIR/dns.ready says it listens.

  python3 fake_dns.py DIR
"""
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
