#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The delay target through real clients: reads come from the read device,
# writes (and zero) land on the write device, flushes complete, with small
# delays on every class; the 3-argument form round-trips data with
# nbdcopy across two delay targets; the size is the table's.
# No timing is asserted (that is a benchmark's job): only that delayed
# I/O completes with the right data in the right place.  Holding I/O back
# and releasing it on suspend is tested in test-unit-delay, and here too
# through nbdmsetup when it is built.
source "${top_srcdir:-$(dirname "$0")/..}/tests/functions.sh"

requires nbdkit --version
requires nbdsh --version
requires nbdcopy --version
requires cmp --version

r=$(mkfile r.img 1M); w=$(mkfile w.img 1M); f=$(mkfile f.img 1M)
fill_random "$r" $((1024 * 1024)) 1
r=$(realpath "$r"); w=$(realpath "$w"); f=$(realpath "$f")

# Sectors 0-99 delayed (read 10 ms from r+8, write 5 ms to w+16, flush
# 1 ms on f), then linear over r.
cat > "$tmpdir/d.table" <<EOF
0 100 delay $r 8 10 $w 16 5 $f 0 1
100 50 linear $r 500
EOF

mapper -U - "$tmpdir/d.table" --run 'nbdsh -u "$uri" -c "
import os
r = open(\"'"$r"'\", \"rb\").read()
S = 512
assert h.get_size() == 150 * S, h.get_size()
# Reads: the read device at offset 8 sectors, then the linear tail.
got = h.pread(150 * S, 0)
assert got[:100 * S] == r[8 * S:108 * S], \"delayed read\"
assert got[100 * S:] == r[500 * S:550 * S], \"linear tail\"
# Unaligned, across the delay/linear edge.
assert h.pread(1001, 100 * S - 500) == r[108 * S - 500:108 * S] + r[500 * S:500 * S + 501]
# Writes go to the write device (reads still come from the read device).
data = os.urandom(3 * S + 11)
h.pwrite(data, 7 * S + 3)
h.pwrite(data, 20 * S, nbd.CMD_FLAG_FUA)
h.zero(2 * S, 40 * S)
h.trim(S, 60 * S)
h.flush()
assert h.pread(4 * S, 7 * S) == r[15 * S:19 * S], \"reads stay on the read device\"
w = open(\"'"$w"'\", \"rb\").read()
assert w[23 * S + 3:23 * S + 3 + len(data)] == data, \"write landed on w+16\"
assert w[36 * S:36 * S + len(data)] == data, \"FUA write landed\"
assert w[56 * S:58 * S] == bytes(2 * S), \"zero landed\"
print(\"ok\")
"' || die "9-argument delay"

# 3-argument form, two delay targets back to back: a copy in and out.
cat > "$tmpdir/d3.table" <<EOF
0 1000 delay $w 0 2
1000 1048 delay $w 1000 3
EOF
fill_random "$tmpdir/in.img" $((2048 * 512)) 7
mapper -U - "$tmpdir/d3.table" --run '
    nbdcopy "'"$tmpdir"'/in.img" "$uri" &&
    nbdcopy "$uri" "'"$tmpdir"'/out.img"' || die "nbdcopy through delay"
cmp "$tmpdir/in.img" "$tmpdir/out.img" || die "data read back differs"
cmp "$tmpdir/in.img" "$w" || die "write device differs from what was written"

# With the control plane: a read held by an hour's delay shows in status,
# and "nbdmsetup suspend" releases it at once (a "timeout" turns a hang
# into a failure; nothing is timed); after resume, reads are held again.
: "${NBDMSETUP:=$top_builddir/client-tools/nbdmsetup/nbdmsetup}"
if [ -x "$NBDMSETUP" ]; then
    sock=$tmpdir/held.sock
    echo "0 2048 delay $r 0 3600000" > "$tmpdir/held.table"
    start_server held mapper "$tmpdir/held.table"
    ms () { timeout 60 "$NBDMSETUP" -a "nbd+unix:///control?socket=$sock" "$@"; }
    held_read ()
    {
        nbdsh -u "nbd+unix:///held?socket=$sock" \
            -c 'assert h.pread(512, 512) == open("'"$r"'", "rb").read()[512:1024]' \
            -c 'print("read done")' > "$tmpdir/reader.out" 2>&1 &
        rpid=$!
        for _ in $(seq 600); do
            ms status held | grep -q "delay 1 0 0" && break
            sleep 0.1
        done
        ms status held | grep -q "delay 1 0 0" || die "the read is not held"
        kill -0 "$rpid" || die "the held read finished"
        ms suspend held || die "suspend"
        timeout 60 tail --pid="$rpid" -f /dev/null || die "suspend did not release the read"
        wait "$rpid" || { cat "$tmpdir/reader.out"; die "the released read failed"; }
        grep -q "read done" "$tmpdir/reader.out" || die "no read"
        ms status held | grep -q "delay 0 0 0" || die "status after release"
        ms resume held || die "resume"
        echo "a held read was released by suspend"
    }
    held_read
    held_read               # held again after resume
fi

echo "$0: ok"
