#!/usr/bin/env bash
# remote-timeout=3: a backend that is gone for good fails requests with
# EIO (after the timeout, then at once while it stays down) while the
# server and its other devices keep working, and block status over it
# says data instead of failing; a stalled server (every read
# delayed 20 s) fails the read with EIO instead of hanging the worker, and
# the backend keeps serving writes on a fresh connection.  Out-of-range
# remote-timeout and remote-connections values are refused at startup,
# and a server that never answers the handshake fails the table load.
source "${top_srcdir:-$(dirname "$0")/..}/tests/functions.sh"
source "$top_srcdir/tests/remote-functions.sh"

requires nbdkit --version
requires python3 -c 'import nbd'
requires nbdkit --filter=delay null --version

backend gone memory 1M
backend slow --filter=delay memory 1M delay-read=20
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
# The largest values are taken.
mapper -U - remote-timeout=86400 remote-connections=64 \
       "$tmpdir/local.table" --run true ||
    die "remote-timeout=86400 remote-connections=64 refused"

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
cleanup_fn "kill $!"
wait_file "$tmpdir/mute.ready"
echo "0 2048 linear nbd+unix:///?socket=$tmpdir/mute.sock 0" > "$tmpdir/mute.table"
if mapper -U - remote-timeout=2 "$tmpdir/mute.table" --run true \
        2> "$tmpdir/mute.err"; then
    die "a table over a server that never answers was loaded"
fi
grep -qF "mute.table:1: linear: nbd+unix:///?socket=$tmpdir/mute.sock: connect: timed out after 2s" \
     "$tmpdir/mute.err" || { cat "$tmpdir/mute.err"; die "mute server: no timeout message"; }

cat > "$tmpdir/timeout.py" <<'EOF'
import errno, os, signal, sys, time
import nbd
from nbdcheck import connect, fails_eio
sock, d = sys.argv[1:3]
gone, slow, local = [connect(sock, n) for n in ("gone", "slow", "local")]

gone.pwrite(b"g" * 512, 0)
local.pwrite(b"l" * 512, 0)
os.kill(int(open(d + "/gone.pid").read()), signal.SIGKILL)
t = time.monotonic()
assert fails_eio(gone.pread, 512, 0), "read from a dead backend worked"
print("dead backend: EIO after %.1fs" % (time.monotonic() - t))
assert local.pread(512, 0) == b"l" * 512      # the rest still works
t = time.monotonic()
assert fails_eio(gone.pwrite, b"x" * 512, 512)
print("still dead: EIO after %.1fs" % (time.monotonic() - t))
# Block status over it does not fail (that fails a client's whole map):
# all data, since reads there fail.
m = nbd.NBD()
m.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
m.connect_uri("nbd+unix:///gone?socket=%s" % sock)
got = []
def extent(ctx, off, entries, err):
    if ctx == nbd.CONTEXT_BASE_ALLOCATION:
        got.extend(entries)
    return 0
m.block_status(1 << 20, 0, extent)
assert got == [1 << 20, 0], "block status over a dead backend: %r" % got
m.shutdown()

# Stalled: the read waits 20 s at the server; ours gives up first.
slow.pwrite(b"s" * 512, 0)
t = time.monotonic()
assert fails_eio(slow.pread, 512, 0), "stalled read did not fail"
print("stalled read: EIO after %.1fs" % (time.monotonic() - t))
slow.pwrite(b"t" * 512, 512)                  # a new connection serves it
local.pwrite(b"m" * 512, 512)
assert local.pread(1024, 0) == b"l" * 512 + b"m" * 512
for h in (gone, slow, local):
    h.shutdown()
print("timeout.py: ok")
EOF

mapper -U - remote-timeout=3 "$tmpdir/gone.table" "$tmpdir/slow.table" \
       "$tmpdir/local.table" \
       --run "python3 '$tmpdir/timeout.py' \"\$unixsocket\" '$tmpdir'" ||
    die "remote timeouts"
echo "$0: ok"
