#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# A mirror with one local leg and one remote leg (an nbdkit memory server
# on a Unix socket).  The remote server is killed in the middle of a fio
# --verify run: with handle_errors the client sees no error and status
# shows the remote leg as D.  Then a fresh server replaces the leg ("sync"
# table): resync completes, status is all A, and the legs are
# byte-identical.
source "${top_srcdir:-$(dirname "$0")/..}/tests/functions.sh"

requires nbdkit --version
requires nbdkit memory --version
requires nbdcopy --version
requires fio --version
requires sh -c 'fio --enghelp=nbd 2>&1 | grep -q uri'


# The remote leg's server: start_server puts it on $sock, pid in $pidfile.
sock="$tmpdir/remote.sock"
pidfile="$tmpdir/remote.pid"
start_remote () { start_server remote memory 32M; }

start_remote
leg0=$(mkfile leg0.img 32M)
remote="nbd+unix:///?socket=$sock"

cat > "$tmpdir/m.table" <<EOF
0 65536 mirror core 2 1024 nosync 2 $leg0 0 $remote 0 1 handle_errors
EOF

# 1. Kill the remote leg's server while fio writes and verifies.
cat > "$tmpdir/fio.sh" <<EOF
cd "$tmpdir"
fio --ioengine=nbd --uri="nbd+unix:///m?socket=\$1" --name=kill \
    --rw=randwrite --bs=64k --size=32M --iodepth=8 --time_based --runtime=6 \
    --verify=crc32c --verify_backlog=16 --verify_fatal=1 \
    --verify_state_save=0 > "$tmpdir/fio.out" 2>&1 &
fio=\$!
sleep 1
kill \$(cat "$pidfile"); rm -f "$pidfile"
wait \$fio || { cat "$tmpdir/fio.out"; exit 1; }
if grep -Ei 'verify.*(fail|bad)|bad magic|crc32c.*wanted|err= *[1-9]' \
        "$tmpdir/fio.out"; then cat "$tmpdir/fio.out"; exit 1; fi
grep -E 'WRITE:|READ:' "$tmpdir/fio.out" || :
EOF
mapper -f -v -U - "$tmpdir/m.table" remote-timeout=2 \
       --run "bash '$tmpdir/fio.sh' \"\$unixsocket\"" 2> "$tmpdir/log1" || {
    grep -v 'debug: mapper\[' "$tmpdir/log1" | tail -20
    die "fio saw an error when the remote leg died"; }
grep -E 'mirror .*leg 1 .*failed a write\): 2 \S+ \S+ 64/64 1 AD 1 core' \
     "$tmpdir/log1" || die "status does not show the remote leg as D"

# 2. A fresh server replaces the leg: resync.
start_remote
cat > "$tmpdir/m.table" <<EOF
0 65536 mirror core 2 1024 sync 2 $leg0 0 $remote 0 1 handle_errors
EOF
start_server --stderr "$tmpdir/log2" m -f -v mapper "$tmpdir/m.table" \
    remote-timeout=2
wait_for grep -q 'resync complete' "$tmpdir/log2" || {
    grep -v 'debug: mapper\[' "$tmpdir/log2" | tail -20; die "no resync"; }
stop_server m
grep -E 'resync complete\): 2 \S+ \S+ 64/64 1 AA 1 core' "$tmpdir/log2" ||
    die "status after resync is not all A"
nbdcopy "$remote" "$tmpdir/remote.copy"
cmp "$leg0" "$tmpdir/remote.copy" || die "legs differ after resync"

echo "$0: ok"
