#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# remote-timeout=3: a backend that is gone for good fails requests with
# EIO (after the timeout, then at once while it stays down) while the
# server and its other devices keep working, and block status over it
# says data instead of failing; a stalled server (every read
# delayed 20 s) fails the read with EIO instead of hanging the worker, and
# the backend keeps serving writes on a fresh connection.  Out-of-range
# remote-timeout, remote-connections and remote-poll-max-us values are
# refused at startup, and a server that never answers the handshake
# fails the table load.
source "${top_srcdir:-$(dirname "$0")/..}/tests/functions.sh"

requires nbdkit --version
requires python3 -c 'import nbd'
requires nbdkit --filter=delay null --version

start_server gone memory 1M
start_server slow --filter=delay memory 1M delay-read=20
l=$(mkfile local.img 1M)
echo "0 2048 linear nbd+unix:///?socket=$tmpdir/gone.sock 0" > "$tmpdir/gone.table"
echo "0 2048 linear nbd+unix:///?socket=$tmpdir/slow.sock 0" > "$tmpdir/slow.table"
echo "0 2048 linear $l 0" > "$tmpdir/local.table"

# refused PARAM=VALUE MESSAGE: nbdkit does not start, and says why.
refused ()
{
    if mapper -U - "$1" "$tmpdir/local.table" --run true \
            2> "$tmpdir/param.err"; then
        die "$1 was accepted"
    fi
    grep -qF -- "$2" "$tmpdir/param.err" ||
        { cat "$tmpdir/param.err"; die "$1: no '$2' in the error"; }
}
refused remote-timeout=0 "remote-timeout=0: must be between 1 and 86400"
refused remote-timeout=86401 "remote-timeout=86401: must be between 1 and 86400"
refused remote-timeout=-1 "remote-timeout: negative numbers are not allowed"
refused remote-connections=0 "remote-connections=0: must be between 1 and 64"
refused remote-connections=65 "remote-connections=65: must be between 1 and 64"
refused remote-connections=2x "remote-connections: could not parse number"
refused remote-poll-max-us=1000001 "remote-poll-max-us=1000001: must be between 0 (off) and 1000000"
refused remote-poll-max-us=-1 "remote-poll-max-us: negative numbers are not allowed"
refused remote-poll-max-us=32us "remote-poll-max-us: could not parse number"
# The largest values are taken.
mapper -U - remote-timeout=86400 remote-connections=64 \
       remote-poll-max-us=1000000 "$tmpdir/local.table" --run true ||
    die "remote-timeout=86400 remote-connections=64 remote-poll-max-us=1000000 refused"
mapper -U - remote-poll-max-us=0 "$tmpdir/local.table" --run true ||
    die "remote-poll-max-us=0 refused"

# A server that accepts and never answers: loading the table gives up
# after remote-timeout, and says which line, target and URI.
python3 -c '
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.bind(sys.argv[1])
s.listen()
open(sys.argv[2], "w").write("ready\n")
held = []
while True:
    held.append(s.accept())' "$tmpdir/mute.sock" "$tmpdir/mute.ready" &
cleanup_fn "kill_job $!"
wait_file "$tmpdir/mute.ready"
echo "0 2048 linear nbd+unix:///?socket=$tmpdir/mute.sock 0" > "$tmpdir/mute.table"
if mapper -U - remote-timeout=2 "$tmpdir/mute.table" --run true \
        2> "$tmpdir/mute.err"; then
    die "a table over a server that never answers was loaded"
fi
grep -qF "mute.table:1: linear: nbd+unix:///?socket=$tmpdir/mute.sock: connect: timed out after 2s" \
     "$tmpdir/mute.err" || { cat "$tmpdir/mute.err"; die "mute server: no timeout message"; }

mapper -U - remote-timeout=3 "$tmpdir/gone.table" "$tmpdir/slow.table" \
       "$tmpdir/local.table" \
       --run "python3 '$top_srcdir/tests/remote_timeout.py' \"\$unixsocket\" '$tmpdir'" ||
    die "remote timeouts"
echo "$0: ok"
