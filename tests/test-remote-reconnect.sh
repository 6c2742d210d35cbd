#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# A file-backed remote backend killed with SIGKILL in the middle of a
# verified fio run and restarted within remote-timeout: the run finishes
# with no error (requests are retried on the new connections).  Then the
# flush rule: writes acknowledged but not flushed when the connection was
# lost make the next flush fail with EIO, once.
source "${top_srcdir:-$(dirname "$0")/..}/tests/functions.sh"

requires nbdkit --version
requires python3 -c 'import nbd'
requires fio --version
requires sh -c 'fio --enghelp=nbd 2>&1 | grep -q uri'

f=$(mkfile r.img 16M)
start_server r file "$f"
echo "0 32768 linear nbd+unix:///?socket=$tmpdir/r.sock 0" > "$tmpdir/d.table"

start_server mapper mapper remote-timeout=20 "$tmpdir/d.table"
uri="nbd+unix:///d?socket=$tmpdir/mapper.sock"

# About 3 s of rate-limited verified writes, then the verify pass; the
# backend is killed after 1 s and back 1 s later.
fio --name=kill --ioengine=nbd --uri="$uri" --rw=randwrite --bs=4k \
    --size=16M --io_size=8M --iodepth=16 --rate_iops=700 \
    --verify=crc32c --do_verify=1 --verify_fatal=1 --verify_state_save=0 \
    > "$tmpdir/fio.out" 2>&1 &
fio=$!
sleep 1
stop_server r KILL
sleep 1
start_server r file "$f"
wait $fio || { cat "$tmpdir/fio.out"; die "fio failed across the restart"; }
if grep -Ei 'verify.*(fail|bad)|bad magic|err= *[1-9]' "$tmpdir/fio.out"; then
    cat "$tmpdir/fio.out"; die "fio saw an error across the restart"
fi
grep -E 'WRITE:' "$tmpdir/fio.out"

# Unflushed writes, then the connections are lost: the next flush of
# the connection that was open fails with EIO, the one after succeeds,
# and the data is readable.  A connection opened after a loss is not
# affected (fio's, which never flushed, is gone).
python3 - "$uri" "$tmpdir" "$f" <<'PYEOF' || die "flush after lost writes"
import sys
import nbd
from nbdcheck import fails_eio, restart_server
uri, d, f = sys.argv[1:4]
h = nbd.NBD()
h.connect_uri(uri)
# fio's writes were not flushed when its backend was killed, but this
# connection came after: nothing of its own was lost.
h.flush()
h.pwrite(b"A" * 4096, 0)
restart_server(d, "r", ["file", f])
assert h.pread(4096, 0) == b"A" * 4096      # retried on a new connection
assert fails_eio(h.flush), "flush after a lost connection succeeded"
h.flush()                                   # once only
h.pwrite(b"B" * 4096, 4096)
h.flush()
h.shutdown()
print("flush after lost writes: EIO once")
PYEOF
echo "$0: ok"
