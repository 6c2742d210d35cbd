#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdmsetup clients: each connection with its export, its peer (Unix:
# uid and pid; TCP: address and port), TLS, since when, requests in
# flight (0 at rest, 1 for a request held by a suspended device or a
# delay target, as stats' in_progress) and done; --json; a device's
# only, the control export's only; bad input.
source "$(dirname "$0")/functions-ms.sh"
requires nbdsh --version
requires python3 -c 'import json'

a=$(mkfile a.img 1M)
mkdir "$tmpdir/tables"
echo "0 2048 linear $a 0" > "$tmpdir/tables/d1.table"
# Reads wait a minute: long enough to be seen in flight; a suspend lets
# them go (the delay target's presuspend).
echo "0 2048 delay $a 0 60000" > "$tmpdir/tables/slow.table"
start_server ctl mapper tables="$tmpdir/tables"
t0=$(date +%s)

# cl [ARGS...]: ms clients --json ARGS as Python literals, one a line.
cl ()
{
    ms clients --json "$@" | python3 -c '
import json, sys
for c in json.load(sys.stdin)["clients"]:
    print(c["export"], c["family"], c["peer"], c["tls"], c["in_flight"],
          c["requests"], int(c["since"]))'
}

# Only nbdmsetup's own connection, running its one request.
me=$(id -u)
cl > "$tmpdir/cl"
cat "$tmpdir/cl"
[ "$(wc -l < "$tmpdir/cl")" = 1 ] || die "one connection expected"
grep -Eq "^control unix uid=$me,pid=[0-9]+ False 1 [0-9]+ [0-9]+$" "$tmpdir/cl" ||
    die "control connection: $(cat "$tmpdir/cl")"
[ -z "$(cl d1)" ] || die "d1 has no client yet"

# A client that read 3 times and stays connected.
export tmpdir
nbdsh -u "nbd+unix:///d1?socket=$sock" -c '
import os, time
for i in range(3):
    h.pread(4096, i * 4096)
open(os.environ["tmpdir"] + "/ready", "w").write("1")
while not os.path.exists(os.environ["tmpdir"] + "/stop"):
    time.sleep(0.05)
' &
held=$!
cleanup_fn "touch '$tmpdir/stop'; wait $held"
wait_file "$tmpdir/ready"
cl d1 > "$tmpdir/cl"
cat "$tmpdir/cl"
read -r exp fam peer tls inflight reqs since < "$tmpdir/cl"
[ "$(wc -l < "$tmpdir/cl")" = 1 ] || die "d1: one client"
[ "$exp $fam $peer $tls $inflight $reqs" = "d1 unix uid=$me,pid=$held False 0 3" ] ||
    die "d1's client: $(cat "$tmpdir/cl")"
[ "$since" -ge "$t0" ] && [ "$since" -le "$(date +%s)" ] ||
    die "since $since is not between the test's start and now"
# The text form: the same, since in UTC.
ms clients d1 > "$tmpdir/text"
cat "$tmpdir/text"
head -1 "$tmpdir/text" | grep -Eq '^Export +Peer +TLS +Since +InFlight +Requests$' ||
    die "clients header"
grep -Eq "^d1 +uid=$me,pid=$held +no +[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:]{8}Z +0 +3$" \
     "$tmpdir/text" || die "clients text"
# Every connection: the control one and d1's, in the order they opened.
# nbdkit drops a connection once its thread has seen it close, which may
# be after the client has exited (the nbdmsetup runs just before): wait
# for that, not for a time.
exports () { [ "$(cl "${@:2}" | cut -d' ' -f1 | tr '\n' ' ')" = "$1" ]; }
wait_for exports "d1 control " || die "all clients: $(cl)"
wait_for exports "control " control || die "clients control: $(cl control)"

# A request held by the suspended device is in flight (at the gate, so
# not yet in the device's statistics).
ms suspend d1
nbdsh -u "nbd+unix:///d1?socket=$sock" -c 'h.pread(512, 0)' &
reader=$!
wait_for sh -c '"$NBDMSETUP" clients --json d1 | grep -q "\"in_flight\": 1"' ||
    die "the held request is not in flight: $(cl d1)"
ms resume d1
wait "$reader" || die "the held read failed"
# The reader's connection, closed, goes in its own time (as above).
wait_for exports "d1 " d1 || die "the reader's connection stays: $(cl d1)"
[ "$(cl d1 | cut -d' ' -f2-5)" = "unix uid=$me,pid=$held False 0" ] ||
    die "in flight after resume: $(cl d1)"

# A read held by a delay target: in flight for clients and stats both.
nbdsh -u "nbd+unix:///slow?socket=$sock" -c 'h.pread(512, 0)' &
reader=$!
in_progress ()
{
    ms stats --json slow | python3 -c '
import json, sys
print(json.load(sys.stdin)["devices"][0]["regions"][0]["in_progress"])'
}
wait_for sh -c '"$NBDMSETUP" stats --json slow | grep -q "\"in_progress\": 1,"' ||
    die "stats: the delayed read is not in progress"
[ "$(cl slow | cut -d' ' -f5)" = 1 ] || die "clients: $(cl slow)"
ms suspend slow                 # lets the read go
wait "$reader" || :
ms resume slow
[ "$(in_progress)" = 0 ] || die "in progress after the read: $(in_progress)"
[ "$(ms stats --json slow | python3 -c '
import json, sys
print(json.load(sys.stdin)["devices"][0]["regions"][0]["reads"])')" = 1 ] ||
    die "slow: one read"

# Bad input.
fails 'clients: no such device: nope' ms clients nope
fails 'clients: wrong number of arguments' ms clients d1 d2
fails '--clear is an option of stats' ms clients --clear

# TCP, with and without TLS: the peer's address and port.
requires sh -c 'nbdkit --dump-config | grep -q tls=yes'
requires nbdsh -c 'assert h.supports_tls()'
echo "alice:$(python3 -c 'import secrets; print(secrets.token_hex(32))')" \
     > "$tmpdir/keys.psk"
head -c 48 /dev/urandom > "$tmpdir/key"
chmod 600 "$tmpdir/keys.psk" "$tmpdir/key"
port=$(free_port)
echo "0 2048 linear $a 0" > "$tmpdir/t1.table"
start_server tcp mapper -i 127.0.0.1 -p "$port" --tls=on \
    --tls-psk="$tmpdir/keys.psk" "$tmpdir/t1.table" control-key="$tmpdir/key"
for u in "nbd://127.0.0.1:$port/t1" \
         "nbds://alice@127.0.0.1:$port/t1?tls-psk-file=$tmpdir/keys.psk"; do
    rm -f "$tmpdir/ready"
    URI=$u nbdsh -c '
import os, time
h.set_uri_allow_local_file(True)
h.connect_uri(os.environ["URI"])
open(os.environ["tmpdir"] + "/ready", "w").write("1")
while not os.path.exists(os.environ["tmpdir"] + "/stop"):
    time.sleep(0.05)
' &
    cleanup_fn "touch '$tmpdir/stop'; wait $!"
    wait_file "$tmpdir/ready"
done
NBDMSETUP_URI="nbd://127.0.0.1:$port/control" NBDMSETUP_KEY="$tmpdir/key" \
    cl > "$tmpdir/cl"
cat "$tmpdir/cl"
[ "$(wc -l < "$tmpdir/cl")" = 3 ] || die "tcp: 3 connections"
sed -n 1p "$tmpdir/cl" | grep -Eq '^t1 tcp 127\.0\.0\.1:[0-9]+ False 0 0 ' ||
    die "tcp client"
sed -n 2p "$tmpdir/cl" | grep -Eq '^t1 tcp 127\.0\.0\.1:[0-9]+ True 0 0 ' ||
    die "tls client"
sed -n 3p "$tmpdir/cl" | grep -Eq '^control tcp 127\.0\.0\.1:[0-9]+ False 1 ' ||
    die "control over tcp"
# Each its own port, none the server's.
ports=$(cut -d' ' -f3 "$tmpdir/cl" | cut -d: -f2 | sort -u)
[ "$(wc -l <<< "$ports")" = 3 ] || die "ports: $ports"
! grep -qx "$port" <<< "$ports" || die "a client has the server's port"
# IPv6: the address in brackets, as in a URI.
if python3 -c 'import socket; socket.socket(socket.AF_INET6).bind(("::1", 0))' 2>/dev/null; then
    port6=$(python3 -c 'import socket
s = socket.socket(socket.AF_INET6); s.bind(("::1", 0)); print(s.getsockname()[1])')
    start_server tcp6 mapper -i ::1 -p "$port6" "$tmpdir/t1.table" \
        control-key="$tmpdir/key"
    NBDMSETUP_URI="nbd://[::1]:$port6/control" NBDMSETUP_KEY="$tmpdir/key" \
        cl > "$tmpdir/cl"
    cat "$tmpdir/cl"
    grep -Eq '^control tcp \[::1\]:[0-9]+ False 1 ' "$tmpdir/cl" ||
        die "IPv6 peer: $(cat "$tmpdir/cl")"
else
    echo "no IPv6 loopback: the IPv6 peer is not checked"
fi
echo "clients: ok"
