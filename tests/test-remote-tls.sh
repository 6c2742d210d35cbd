#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# A remote backend that requires TLS with a pre-shared key: the nbds+unix
# URI names the user and the key file (a local file, which the plugin
# allows); data goes through.  A wrong key fails at table load with the
# server's name in the message.
source "${top_srcdir:-$(dirname "$0")/..}/tests/functions.sh"

requires nbdkit --version
requires python3 -c 'import nbd'
requires sh -c 'nbdkit --dump-config | grep -q tls=yes'
requires nbdsh -c 'assert h.supports_tls()'

# The PSK file format of psktool: user:hexkey.
echo "alice:$(python3 -c 'import secrets; print(secrets.token_hex(32))')" \
     > "$tmpdir/keys.psk"
echo "alice:$(python3 -c 'import secrets; print(secrets.token_hex(32))')" \
     > "$tmpdir/wrong.psk"
chmod 600 "$tmpdir/keys.psk" "$tmpdir/wrong.psk"
start_server t --tls=require --tls-psk="$tmpdir/keys.psk" memory 1M

u="nbds+unix://alice@/?socket=$tmpdir/t.sock"
echo "0 2048 linear $u&tls-psk-file=$tmpdir/keys.psk 0" > "$tmpdir/t.table"

cat > "$tmpdir/tls.py" <<'EOF'
import sys
import nbd
h = nbd.NBD()
h.connect_uri(sys.argv[1])
h.pwrite(b"secret" * 100, 1000)
h.flush()
assert h.pread(600, 1000) == b"secret" * 100
h.shutdown()
# Straight from the TLS server.
t = nbd.NBD()
t.set_uri_allow_local_file(True)
t.connect_uri(sys.argv[2])
assert t.pread(600, 1000) == b"secret" * 100
t.shutdown()
print("tls.py: ok")
EOF
mapper -U - "$tmpdir/t.table" \
       --run "python3 '$tmpdir/tls.py' \"\$uri\" '$u&tls-psk-file=$tmpdir/keys.psk'" ||
    die "TLS-PSK backend"

# The wrong key: no device.
echo "0 2048 linear $u&tls-psk-file=$tmpdir/wrong.psk 0" > "$tmpdir/w.table"
if mapper -U - remote-timeout=5 "$tmpdir/w.table" --run true 2> "$tmpdir/w.err"; then
    die "table with a wrong TLS key loaded"
fi
grep -q "w.table:1: linear: nbds+unix://alice@/?socket=.*t.sock" "$tmpdir/w.err" ||
    { cat "$tmpdir/w.err"; die "wrong key: unclear message"; }
echo "$0: ok"
