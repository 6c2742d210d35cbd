#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Access control: control-key=FILE checks (size, mode), HMAC tags (right
# key, wrong key, missing key, replay), no key: Unix peers by uid only,
# TCP refused with a hint; all of it under nbdkit --tls=require (PSK).
source "$(dirname "$0")/functions-ms.sh"
requires python3 -c 'import nbd'

head -c 48 /dev/urandom > "$tmpdir/key"; chmod 600 "$tmpdir/key"
head -c 48 /dev/urandom > "$tmpdir/wrong"; chmod 600 "$tmpdir/wrong"
echo "0 8 zero" > "$tmpdir/d1.table"

# Key file checks, at start: readable by others, too short, missing.
refuse_start () { mapper_refuses "$1" "$tmpdir/d1.table" "${@:2}"; }
cp "$tmpdir/key" "$tmpdir/key644"; chmod 644 "$tmpdir/key644"
refuse_start 'group or others.*chmod 600' control-key="$tmpdir/key644"
head -c 16 /dev/urandom > "$tmpdir/short"; chmod 600 "$tmpdir/short"
refuse_start 'is 16 bytes: a key must be 32' control-key="$tmpdir/short"
refuse_start "$tmpdir/nokey: No such file" control-key="$tmpdir/nokey"

# With a key: right key works, wrong/missing key refused, nothing changed.
start_server ctl mapper "$tmpdir/d1.table" control-key="$tmpdir/key"
ms -k "$tmpdir/key" create k1 --table "0 8 zero"
NBDMSETUP_KEY="$tmpdir/key" ms table k1 | grep -qx '0 8 zero' || die "key env"
fails 'requires a key' ms ls
fails 'bad HMAC tag' ms -k "$tmpdir/wrong" remove k1
fails 'bad HMAC tag' ms -k "$tmpdir/wrong" create -n k2
fails 'group or others' ms -k "$tmpdir/key644" ls
[ "$(ms -k "$tmpdir/key" ls)" = "d1
k1" ] || die "state changed by refused requests"

PYTHONPATH="$(dirname "$0")" python3 - "$NBDMSETUP_URI" "$tmpdir/key" "$tmpdir/wrong" <<'PY'
import sys
from ctlproto import Conn
uri, key, wrong = sys.argv[1], open(sys.argv[2], "rb").read(), open(sys.argv[3], "rb").read()
c = Conn(uri, key)
assert c.key_required
msg = c.encode("remove", ["k1"], seq=1, key=wrong)
st, text = c.raw(msg)
assert st == 5 and b"bad HMAC tag" in text, text
# No tag at all.
st, text = c.raw(c.encode("ls", seq=2, key=b""))
assert st == 5 and b"bad HMAC tag" in text, text
# A good request replayed on the same connection, then on another one
# (whose nonce differs): both refused.
good = c.encode("rename", ["k1", "k9"], seq=3)
assert c.raw(good)[0] == 0
st, text = c.raw(good)
assert st == 5 and b"replayed" in text, text
c2 = Conn(uri, key)
assert c2.nonce != c.nonce
st, text = c2.raw(good)
assert st == 5 and b"bad HMAC tag" in text, text
# A flipped bit in the body.
m = bytearray(c2.encode("rename", ["k9", "k1"], seq=1)); m[-1] ^= 1
st, text = c2.raw(bytes(m))
assert st == 5 and b"bad HMAC tag" in text, text
assert c2.call("rename", "k9", "k1", seq=2)[0] == 0
print("hmac ok")
PY
stop_server ctl

# No key: the server's own uid over Unix is fine (we are root); another
# uid is refused; TCP is refused with a hint to configure a key.
start_server ctl mapper "$tmpdir/d1.table"
ms ls | grep -qx d1 || die "root over Unix refused"
if setpriv --reuid=65534 --regid=65534 --clear-groups true 2>/dev/null; then
    chmod 755 "$tmpdir"; chmod 777 "$sock"
    fails 'refused for uid 65534' \
        setpriv --reuid=65534 --regid=65534 --clear-groups "$NBDMSETUP" ls
    chmod 700 "$tmpdir"
fi
stop_server ctl
port=$(free_port)
start_server ctl -i 127.0.0.1 -p "$port" mapper "$tmpdir/d1.table"
fails 'over TCP needs a key.*control-key' ms -a "nbd://127.0.0.1:$port/control" ls
stop_server ctl
start_server ctl -i 127.0.0.1 -p "$port" mapper "$tmpdir/d1.table" \
    control-key="$tmpdir/key"
ms -a "nbd://127.0.0.1:$port/control" -k "$tmpdir/key" ls | grep -qx d1 ||
    die "TCP with a key"
stop_server ctl

# TLS with a PSK, over TCP and over Unix.
requires sh -c "nbdkit --dump-config | grep -q ^tls=yes"
echo "alice:$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')" > "$tmpdir/psk"
chmod 600 "$tmpdir/psk"
start_server ctl --tls=require --tls-psk="$tmpdir/psk" -i 127.0.0.1 \
    -p "$port" mapper "$tmpdir/d1.table" control-key="$tmpdir/key"
ms -k "$tmpdir/key" -a "nbds://alice@127.0.0.1:$port/control?tls-psk-file=$tmpdir/psk" \
   create t1 --table "0 16 zero"
[ "$(ms -k "$tmpdir/key" -a "nbds://alice@127.0.0.1:$port/control?tls-psk-file=$tmpdir/psk" table t1)" = "0 16 zero" ] ||
    die "TLS table"
fails 'nbd_connect_uri|TLS|tls|handshake' ms -k "$tmpdir/key" -a "nbd://127.0.0.1:$port/control" ls
stop_server ctl
start_server ctl --tls=require --tls-psk="$tmpdir/psk" mapper "$tmpdir/d1.table"
ms -a "nbds+unix://alice@/control?socket=$sock&tls-psk-file=$tmpdir/psk" ls |
    grep -qx d1 || die "TLS over Unix without key"
echo "$0: ok"
