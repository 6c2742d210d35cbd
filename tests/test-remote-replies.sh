#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Structured replies on a remote backend's connections.  Only connection
# 0 asks for them (block status needs them); reads and writes go to the
# other connections first, whose read replies are a plain header and the
# data.  Checked on the backend's own debug log (which connection
# negotiated what, and which served each request), with the data and the
# extents checked through the mapper.  Then the backend comes back
# without structured replies: connection 0 refuses to use it (the export
# lost block status), the others carry on, and extents are "all data".
source "${top_srcdir:-$(dirname "$0")/..}/tests/functions.sh"

requires nbdkit --version
requires nbdkit --no-sr null --version
requires python3 -c 'import nbd'

f=$(mkfile r.img 0)
truncate -s 8M "$f"             # sparse: extents come from SEEK_HOLE
log=$tmpdir/back.log

# The backend in the foreground, for its -v log (what each connection
# negotiated); its log filter names the connection of each request.
start_back ()
{
    start_server --stderr "$log" r -f -v "$@" --filter=log file "$f" \
        logfile="$tmpdir/req.log"
}
start_back
echo "0 16384 linear nbd+unix:///?socket=$tmpdir/r.sock 0" > "$tmpdir/d.table"

# negotiated PATTERN: the backend's connections whose negotiation (-v
# log, "nbdkit: file[N]: debug: ...") matches.
negotiated ()
{
    sed -nE "s/^nbdkit: file\[([0-9]+)\]: debug: .*$1.*/\1/p" "$log" | sort -un
}
# served WHAT: the connections that served requests WHAT (Read, Write,
# Extents) after line $mark of the log filter's log.
served ()
{
    tail -n "+$((mark + 1))" "$tmpdir/req.log" |
        sed -nE "s/.* connection=([0-9]+) $1 id=.*/\1/p" | sort -un
}
cat > "$tmpdir/io.py" <<'EOF'
import sys
import nbd
from nbdcheck import connect
h = connect(sys.argv[1], "d")
h2 = nbd.NBD()
h2.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
h2.connect_uri("nbd+unix:///d?socket=" + sys.argv[1])
M = 1 << 20
mode = sys.argv[2]
if mode == "write":
    # Data at 1M and 5M, holes elsewhere; 64 reads in flight at once.
    h.pwrite(b"a" * M, M)
    h.pwrite(b"b" * 4096, 5 * M)
    h.flush()
    bufs = [nbd.Buffer(4096) for _ in range(64)]
    for i, b in enumerate(bufs):
        h.aio_pread(b, M + i * 4096)
    while h.aio_in_flight() > 0:
        h.poll(-1)
    assert all(b.to_bytearray() == b"a" * 4096 for b in bufs)
assert h.pread(4096, 5 * M) == b"b" * 4096
assert h.pread(4096, 3 * M) == bytes(4096)
exts = []
h2.block_status(8 * M, 0, lambda ctx, off, e, err: exts.extend(e))
pos, holes, data = 0, 0, 0
for length, flags in zip(exts[0::2], exts[1::2]):
    if flags & nbd.STATE_HOLE:
        holes += length
        assert pos + length <= M or pos >= 2 * M, (pos, length, exts)
    else:
        data += length
    pos += length
assert pos == 8 * M, exts
if mode == "all-data":
    assert holes == 0, exts
else:
    assert holes > 0 and data >= M + 4096, exts
print("io.py %s: ok, extents %s" % (mode, exts))
EOF

cd "$tmpdir"
start_server m mapper remote-connections=4 \
       remote-timeout=30 "$tmpdir/d.table"
wait_conns_up m d 4/4
mark=$(wc -l < "$tmpdir/req.log")
python3 io.py "$tmpdir/m.sock" write || die "I/O through 4 connections"

# Four connections; one asked for structured replies and base:allocation.
all=$(negotiated 'newstyle negotiation: flags: export' | wc -l)
sr=$(negotiated 'client requested structured replies')
[ "$all" -eq 4 ] || { cat "$log"; die "backend saw $all connections, not 4"; }
[ "$(echo "$sr" | wc -w)" -eq 1 ] ||
    { cat "$log"; die "connections with structured replies: $sr (want one)"; }
[ "$(negotiated 'NBD_OPT_SET_META_CONTEXT: set base:allocation')" = "$sr" ] ||
    { cat "$log"; die "base:allocation not (only) on connection $sr"; }
# Block status on that one; reads and writes on the others.
[ "$(served Extents)" = "$sr" ] ||
    { cat "$tmpdir/req.log"; die "extents not (only) on connection $sr"; }
rw=$(served '(Read|Write)')
[ "$(echo "$rw" | wc -w)" -ge 1 ] ||
    { cat "$tmpdir/req.log"; die "no reads or writes in the log"; }
for c in $rw; do
    [ "$c" != "$sr" ] ||
        { cat "$tmpdir/req.log"; die "a read or write went to connection $sr"; }
done

# The backend comes back without structured replies.  Connection 0 is
# not used (it would lose block status); the other three are.
stop_server r KILL
start_back --no-sr
wait_conns_up m d 3/4
python3 io.py "$tmpdir/m.sock" all-data || die "I/O and extents without connection 0"
# Connection 0 is still not in use (it keeps retrying).
backend_status m || die "status --backends"
grep -q '3/4 connections up' "$tmpdir/status.out" ||
    { cat "$tmpdir/status.out"; die "not 3/4 up after the I/O"; }
# The mapper first: the backend waits for its clients to go.
stop_server m
echo "test-remote-replies: ok"
