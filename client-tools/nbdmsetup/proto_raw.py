# SPDX-License-Identifier: BSD-3-Clause
"""The control export at the wire level (test-nbdmsetup-proto.sh), with
ctlproto.py: truncated, oversized, garbage, wrong-version, junk-trailing
messages, FLUSH without a request, reads past the response, replayed and
reordered sequence numbers are each refused with a status and a message.

  python3 proto_raw.py CONTROL-URI
"""
import struct, sys
from ctlproto import Conn
c = Conn(sys.argv[1])
PROTO, TOOBIG, VERSION, DENIED, NOTSUP, INVALID = 6, 7, 12, 5, 11, 1

def refused(want, msg, pat):
    st, text = c.raw(msg) if isinstance(msg, bytes) else msg
    text = text.decode()
    assert st == want and pat in text, (want, pat, st, text)
    print("refused:", st, text)

seq = [0]
def nxt():
    seq[0] += 1
    return seq[0]

refused(PROTO, c.encode("ls", seq=nxt())[:40], "truncated request")
good = c.encode("ls", seq=nxt())
refused(PROTO, good[:-1] if len(good) > 64 else good[:63], "truncated")
refused(PROTO, b"GARBAGE!" * 16, "not a control request")
refused(VERSION, c.encode("ls", seq=nxt(), version=2), "version 2 not supported")
m = bytearray(c.encode("ls", seq=nxt()))
m[8:12] = struct.pack(">I", 32 << 20)
refused(TOOBIG, bytes(m), "over the 16 MiB maximum")
m = bytearray(c.encode("info", ["d1"], seq=nxt()))
m[64:68] = struct.pack(">I", 1000)
refused(PROTO, bytes(m), "runs past the end")
m = c.encode("info", ["d1"], seq=nxt())
m = m[:8] + struct.pack(">I", len(m) + 5) + m[12:] + b"junk!"
refused(PROTO, m, "junk after the last argument")
m = bytearray(c.encode("ls", seq=nxt())); m[24:28] = struct.pack(">I", 99)
refused(PROTO, bytes(m), "argument count 99")
refused(PROTO, c.encode("ls", seq=nxt(), flags=0x100), "unknown request flags")
refused(PROTO, c.encode("info", [b"d\x001"], seq=nxt()), "NUL byte")
refused(NOTSUP, c.call(99, seq=nxt()), "unknown command 99")
refused(INVALID, c.call("info", "a", "b", seq=nxt()), "takes 0 to 1 arguments")

# FLUSH with nothing written.
c.h.flush()
st, text = c.response()
assert st == PROTO and b"no request written" in text, (st, text)

# Writes past 16 MiB are refused by the export size.
try:
    c.h.pwrite(b"x", 16 << 20)
    raise AssertionError("write past 16 MiB accepted")
except Exception as e:
    print("refused:", e)

# Replay and reordering: sequence numbers must increase.
st, _ = c.call("ls", seq=100)
assert st == 0
refused(DENIED, c.call("ls", seq=100), "replayed or reordered")
refused(DENIED, c.call("ls", seq=50), "replayed or reordered")
assert c.call("ls", seq=101)[0] == 0

# Reads beyond the response are zeros; the response survives re-reads.
st, text = c.call("table", "d1", seq=102)
assert st == 0 and text == b"d1\t0 8 zero\n", text
assert c.h.pread(4096, 1 << 20) == bytes(4096)
assert c.response() == (0, b"d1\t0 8 zero\n")
print("proto ok")
