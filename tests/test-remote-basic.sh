#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Remote backends: nbdkit memory over a Unix socket and over TCP
# 127.0.0.1, qemu-nbd over a Unix socket.  Data written through the
# mapper is read back directly from the servers (and the other way), at
# every edge of the remapping; zero, trim, FUA, flush and extents pass
# through; two spellings of one URI are one backend (one connection);
# bad URIs are refused with a clear message.
source "${top_srcdir:-$(dirname "$0")/..}/tests/functions.sh"

requires nbdkit --version
requires python3 -c 'import nbd'
requires qemu-nbd --version

port=$(free_port)
start_server a --filter=log memory 4M logfile="$tmpdir/a.log"
start_server b -i 127.0.0.1 -p "$port" memory 4M
qimg=$(mkfile q.img 4M)
start_qemu_nbd q "$qimg"

A="nbd+unix:///?socket=$tmpdir/a.sock"
B="nbd://127.0.0.1:$port"
Q="nbd+unix:///?socket=$tmpdir/q.sock"

# dev: A's second half, then B's first half, then Q at 1M.
# alias: A again, spelled differently (relative path, empty query item,
# no trailing slash): the same backend.
cat > "$tmpdir/dev.table" <<EOF
0 4096 linear $A 4096
4096 4096 linear $B/ 0
8192 2048 linear $Q 2048
EOF
cat > "$tmpdir/alias.table" <<EOF
0 8192 linear NBD+UNIX://?&socket=a.sock 0
EOF

cd "$tmpdir"
mapper -U - ${MAPPER_DEBUG:-} remote-connections=1 "$tmpdir/dev.table" "$tmpdir/alias.table" \
       --run "cd '$tmpdir' && python3 '$top_srcdir/tests/remote_basic.py' \"\$unixsocket\" \
               '$A' '$B' '$Q'" ||
    die "basic remote I/O"

# One backend for both spellings of A, with one connection: the log
# filter saw the basic.py client's connection and exactly one more.
n=$(grep -c 'Connect' "$tmpdir/a.log" || :)
[ "$n" -eq 2 ] || { cat "$tmpdir/a.log"; die "A saw $n connections, expected 2"; }

# Bad URIs: a clear message naming the table line, no server started.
bad ()
{
    echo "0 2048 linear $1 0" > "$tmpdir/bad.table"
    if mapper -U - "$tmpdir/bad.table" --run true 2> "$tmpdir/bad.err"; then
        die "table with $1 loaded"
    fi
    grep -q "bad.table:1: linear: .*$2" "$tmpdir/bad.err" ||
        { cat "$tmpdir/bad.err"; die "no '$2' for $1"; }
}
bad "nbd+unix:///" "needs ?socket=PATH"
bad "nbd+unix://host/?socket=x" "takes no host"
bad "nbd:///export" "needs a host"
bad "nbd://127.0.0.1:$port/x#frag" "fragment"
bad "nbd+unix:///?socket=$tmpdir/none.sock" "none.sock"
bad "nbd+unix:///?socket=%zz" "bad or empty value"
# Beyond the end of the export.
echo "0 8193 linear $A 0" > "$tmpdir/bad.table"
mapper -U - "$tmpdir/bad.table" --run true 2> "$tmpdir/bad.err" &&
    die "oversized table loaded"
grep -q "beyond the end of the device (8192 sectors)" "$tmpdir/bad.err" ||
    { cat "$tmpdir/bad.err"; die "oversized: wrong message"; }

echo "$0: ok"
