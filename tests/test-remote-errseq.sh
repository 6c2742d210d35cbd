#!/usr/bin/env bash
# A remote backend's lost writes are reported to every client connection
# that was open when they were lost, once each (Linux errseq semantics),
# not to whichever connection flushes first; connections opened later
# are not affected; the same through a device stacked on it.
source "${top_srcdir:-$(dirname "$0")/..}/tests/functions.sh"
source "$top_srcdir/tests/remote-functions.sh"
requires nbdsh --version
requires python3 -c 'import nbd'

f=$(mkfile r.img 16M)
backend r file "$f"
echo "0 32768 linear nbd+unix:///?socket=$tmpdir/r.sock 0" > "$tmpdir/d.table"
echo "0 32768 linear mapper:d 0" > "$tmpdir/up.table"
sock=$tmpdir/mapper.sock
mapper -U "$sock" -P "$tmpdir/mapper.pid" remote-timeout=20 \
    remote-connections=4 "$tmpdir/d.table" "$tmpdir/up.table"
cleanup_fn 'stop_pidfile "$tmpdir/mapper.pid"'

python3 - "$sock" "$tmpdir" "$f" <<'PYEOF'
import os, signal, subprocess, sys, time
import nbd
from nbdcheck import fails_eio

sock, d, f = sys.argv[1:4]

def conn(name):
    h = nbd.NBD()
    h.connect_uri("nbd+unix:///%s?socket=%s" % (name, sock))
    return h

def gone(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return open("/proc/%d/stat" % pid).read().split()[2] == "Z"

def restart_backend():
    """kill -9 the backend, start a new one on the same socket."""
    pid = int(open(d + "/r.pid").read())
    os.kill(pid, signal.SIGKILL)
    while not gone(pid):
        time.sleep(0.05)
    os.unlink(d + "/r.sock")
    subprocess.check_call(["nbdkit", "-U", d + "/r.sock", "-P", d + "/r.pid",
                           "file", f])

# --- every connection open at the loss hears of it, once ------------------
for dev in ("d", "up"):
    writer, other = conn(dev), conn(dev)
    writer.pwrite(b"W" * 4096, 0)           # acknowledged, not flushed
    restart_backend()
    assert writer.pread(4096, 0) == b"W" * 4096   # page cache: still there
    later = conn(dev)                       # opened after the loss
    # The other connection flushes first: it hears of the loss ...
    assert fails_eio(other.flush), dev + ": other: flush succeeded"
    other.flush()
    # ... and so does the writer, whose write it was.
    assert fails_eio(writer.flush), dev + ": writer: flush succeeded"
    writer.flush()
    later.flush()
    for h in (writer, other, later):
        h.shutdown()
    print(dev + ": each connection open at the loss failed one flush")

PYEOF
echo "$0: ok"
