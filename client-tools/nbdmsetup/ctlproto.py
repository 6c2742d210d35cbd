# SPDX-License-Identifier: BSD-3-Clause
# Raw control-protocol client for the tests (python3-libnbd), written
# from proto/PROTOCOL.md: lets tests send truncated, oversized, garbage,
# replayed and mis-tagged messages that nbdmsetup would never produce.
import hashlib, hmac, struct
import nbd

REQ_MAGIC, RSP_MAGIC, VERSION = 0x4e424d51, 0x4e424d50, 1
DOMAIN = b"nbdmapper-control-v1"
CMD = dict(version=1, ls=2, create=3, load=4, clear=5, suspend=6, resume=7,
           replace=8, remove=9, rename=10, info=11, table=12, status=13,
           message=14, targets=15, wait=16, stats=17, clients=18)

class Conn:
    def __init__(self, uri, key=None):
        self.h = nbd.NBD()
        self.h.set_uri_allow_local_file(True)
        self.h.connect_uri(uri)
        self.key = key
        st, payload = self.response()
        assert st == 0 and len(payload) == 33, (st, payload)
        self.key_required = payload[0] & 1
        self.nonce = payload[1:]

    def response(self):
        hdr = self.h.pread(24, 0)
        magic, ver, st, total, _res, seq = struct.unpack(">IHHIIQ", hdr)
        assert magic == RSP_MAGIC and ver == VERSION, hdr
        return st, self.h.pread(total, 0)[24:]

    def encode(self, cmd, args=(), flags=0, seq=1, version=VERSION,
               key=None, tag=None):
        body = b"".join(struct.pack(">I", len(a)) + a
                        for a in (x.encode() if isinstance(x, str) else x
                                  for x in args))
        total = 64 + len(body)
        hdr = struct.pack(">IHHIIQII", REQ_MAGIC, version, CMD.get(cmd, cmd),
                          total, flags, seq, len(args), 0)
        key = key if key is not None else self.key
        if tag is None:
            tag = bytes(32)
            if key:
                tag = hmac.new(key, DOMAIN + self.nonce + hdr + bytes(32) +
                               body, hashlib.sha256).digest()
        return hdr + tag + body

    def raw(self, msg):
        self.h.pwrite(msg, 0)
        self.h.flush()
        return self.response()

    def call(self, cmd, *args, **kw):
        return self.raw(self.encode(cmd, args, **kw))
