#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdmsetup gives up on a server that does not answer: while connecting,
# on the HELLO and on a request, with a message naming the step and the
# limit (--timeout SECONDS, $NBDMSETUP_TIMEOUT, default 30).  wait's
# --timeout is the event's, and its reply may take that long.  Every
# nbdmsetup here runs under timeout(1): one that hangs fails the test.
source "$(dirname "$0")/functions-ms.sh"
requires python3 --version

tms () { timeout 60 "$NBDMSETUP" "$@"; }

# --- A server that accepts the connection and never says a word.
python3 - "$tmpdir/silent" <<'PYEOF' &
import socket, sys, time
s = socket.socket(socket.AF_UNIX)
s.bind(sys.argv[1])
s.listen(8)
conns = []
while True:
    conns.append(s.accept()[0])
PYEOF
silent_pid=$!
cleanup_fn "kill_job $silent_pid"
wait_for test -S "$tmpdir/silent"
silent="nbd+unix:///control?socket=$tmpdir/silent"
fails "^nbdmsetup: nbd\+unix:.*: timed out after 1 s connecting \(--timeout\)$" \
    tms -a "$silent" --timeout 1 ls
fails "timed out after 0.5 s connecting \(\\\$NBDMSETUP_TIMEOUT\)" \
    env NBDMSETUP_TIMEOUT=0.5 timeout 60 "$NBDMSETUP" -a "$silent" info
fails "timed out after 1 s connecting" tms -a "$silent" --timeout 1 batch /dev/null
# wait's --timeout is not the connection's.
fails "timed out after 0.5 s connecting \(\\\$NBDMSETUP_TIMEOUT\)" \
    env NBDMSETUP_TIMEOUT=0.5 timeout 60 "$NBDMSETUP" -a "$silent" \
    wait d1 --timeout 100
fails '\$NBDMSETUP_TIMEOUT: .abc. is not a number of seconds' \
    env NBDMSETUP_TIMEOUT=abc "$NBDMSETUP" -a "$silent" ls

# --- A control export whose reads take 10 s (the delay filter): the
# HELLO does not come within the limit.
if nbdkit --filter=delay null --version >/dev/null 2>&1; then
    a=$(mkfile a.img 1M)
    echo "0 2048 linear $a 0" > "$tmpdir/d1.table"
    start_server ctl --filter=delay mapper delay-read=10 "$tmpdir/d1.table"
    fails "^nbdmsetup: nbd\+unix:.*: timed out after 1 s reading the HELLO \(--timeout\)$" \
        tms --timeout 1 ls
    stop_server ctl
else
    echo "$0: the delay filter is missing: HELLO timeout not tested"
fi

# --- A request that takes 4 s to run: create connects to a remote
# backend whose server takes 4 s to open a connection (the delay
# filter).  The message says that the server may still carry it out;
# and it does.
a=$(mkfile b.img 1M)
start_server slow --filter=delay memory 1M delay-open=4
slow="0 2048 linear nbd+unix:///?socket=$tmpdir/slow.sock 0"
mkdir "$tmpdir/tables"
start_server ctl mapper tables="$tmpdir/tables" remote-connections=1
ms create d1 --table "0 2048 linear $a 0"
fails "^nbdmsetup: create: timed out after 1 s waiting for the server to execute the request \(--timeout\); the server may still carry the request out" \
    tms --timeout 1 create r1 --table "$slow"
wait_for sh -c '"$NBDMSETUP" ls | grep -qx r1'
# A command that only reads gets no such note: status waits behind
# another client's slow create (another export name: another backend,
# not r1's).
tms create r2 --table "${slow/:\/\/\//:\/\/\/r2}" &
creator=$!
sleep 1
fails "^nbdmsetup: status: timed out after 1 s waiting for the server to execute the request \(--timeout\)$" \
    tms --timeout 1 status d1
wait "$creator" || die "the slow create failed"

# --- wait: its own --timeout may be longer than the reply timeout.
# The server answers at the event's timeout, after the 1 s of
# $NBDMSETUP_TIMEOUT.
export NBDMSETUP_TIMEOUT=1
fails "^nbdmsetup: wait: device 'd1': timed out waiting for an event" \
    tms wait d1 --timeout 2.5
# An event that comes after 2 s ends a wait of 10 s.
ev=$(ms info d1 | sed -n 's/^Event number: *//p')
tms --json wait d1 "$ev" --timeout 10 > "$tmpdir/wait.out" &
waiter=$!
sleep 2
unset NBDMSETUP_TIMEOUT
ms replace d1 --table "0 2048 linear $a 0"
wait "$waiter" || die "wait for an event after 2 s failed"
[ "$(cat "$tmpdir/wait.out")" = "{\"event_nr\": $((ev + 1))}" ] ||
    die "wait printed $(cat "$tmpdir/wait.out")"
# The same in a batch.
NBDMSETUP_TIMEOUT=1 tms --json batch > "$tmpdir/batch.out" <<EOF &
wait d1 --timeout 10
EOF
waiter=$!
sleep 2
ms replace d1 --table "0 2048 linear $a 0"
wait "$waiter" || die "batch wait for an event after 2 s failed"
grep -q '"event_nr"' "$tmpdir/batch.out" ||
    die "batch wait printed $(cat "$tmpdir/batch.out")"
echo "$0: ok"
