#!/usr/bin/env bash
# Remote backends: nbdkit memory over a Unix socket and over TCP
# 127.0.0.1, qemu-nbd over a Unix socket.  Data written through the
# mapper is read back directly from the servers (and the other way), at
# every edge of the remapping; zero, trim, FUA, flush and extents pass
# through; two spellings of one URI are one backend (one connection);
# bad URIs are refused with a clear message.
source "${top_srcdir:-$(dirname "$0")/..}/tests/functions.sh"
source "$top_srcdir/tests/remote-functions.sh"

requires nbdkit --version
requires python3 -c 'import nbd'
requires qemu-nbd --version

port=$(free_port)
backend a --filter=log memory 4M logfile="$tmpdir/a.log"
backend_tcp b "$port" memory 4M
qimg=$(mkfile q.img 4M)
qemu-nbd -f raw -t --shared=8 -k "$tmpdir/q.sock" --pid-file="$tmpdir/q.pid" \
    "$qimg" & cleanup_fn "kill_backend q"
wait_file "$tmpdir/q.pid"

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

cat > "$tmpdir/basic.py" <<'EOF'
import errno, sys
import nbd
S = 512
sock, A, B, Q = sys.argv[1:5]
def conn(uri):
    h = nbd.NBD()
    h.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
    h.connect_uri(uri)
    return h
dev = conn("nbd+unix:///dev?socket=" + sock)
alias = conn("nbd+unix:///alias?socket=" + sock)
a, b, q = conn(A), conn(B), conn(Q)
assert dev.get_size() == 10240 * S
assert dev.can_multi_conn() and dev.can_fua() and dev.can_zero()

# Across the A|B edge (device sector 4096) and the B|Q edge (8192).
pat = bytes(range(256)) * 16
dev.pwrite(pat, 4096 * S - 1000)
assert a.pread(1000, 8192 * S - 1000) == pat[:1000]
assert b.pread(len(pat) - 1000, 0) == pat[1000:]
dev.pwrite(b"Q" * 3000, 8192 * S - 10, nbd.CMD_FLAG_FUA)
assert b.pread(10, 4096 * S - 10) == b"Q" * 10
assert q.pread(2990, 2048 * S) == b"Q" * 2990
# The other way: written on the servers, read through the mapper.
a.pwrite(b"x" * 512, 8191 * S); b.pwrite(b"y" * 512, 0)
assert dev.pread(1024, 4096 * S - 512) == b"x" * 512 + b"y" * 512
assert alias.pread(512, 8191 * S) == b"x" * 512
# A big request over all three servers at once.
big = bytes([7]) * (10240 * S)
dev.pwrite(big, 0)
assert dev.pread(len(big), 0) == big
assert q.pread(4096, 2048 * S) == bytes([7]) * 4096
dev.flush()
# Zero and trim across edges; extents come from the servers.
dev.zero(2 * 4096 * S, 2048 * S)
assert dev.pread(2 * 4096 * S, 2048 * S) == bytes(2 * 4096 * S)
assert a.pread(S, 4096 * S + 2048 * S) == bytes(S)
dev.zero(S, 4096 * S, nbd.CMD_FLAG_FAST_ZERO)
dev.trim(4096 * S, 4096 * S)
exts = []
def cb(ctx, off, entries, err):
    exts.extend(entries)
alias.block_status(8192 * S, 0, cb)
assert sum(exts[0::2]) >= 4096 * S, exts
assert any(f & 1 for f in exts[1::2]), exts     # a hole somewhere
dev.flush()
for h in (dev, alias, a, b, q):
    h.shutdown()
print("basic.py: ok")
EOF

cd "$tmpdir"
mapper -U - ${MAPPER_DEBUG:-} remote-connections=1 "$tmpdir/dev.table" "$tmpdir/alias.table" \
       --run "cd '$tmpdir' && python3 '$tmpdir/basic.py' \"\$unixsocket\" \
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
