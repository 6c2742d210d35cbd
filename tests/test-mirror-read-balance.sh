#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Reads of an in-sync mirror are balanced over its legs as dm-raid1's
# choose_mirror does (MIN_READS reads on a leg, then the next), wherever
# they fall: 1024 reads of one hot 4 KiB block are served by both legs,
# counted by nbdkit's log filter on each leg's own server (not by the
# mapper's numbers).  A leg that failed is left out: with leg 1's server
# gone, every read goes to leg 0 and none fails.
source "${top_srcdir:-$(dirname "$0")/..}/tests/functions.sh"

requires nbdkit --version
requires nbdkit --filter=log null --version
requires nbdsh --version

for i in 0 1; do
    f=$(mkfile leg$i.img 8M)
    start_server leg$i --filter=log file "$f" logfile="$tmpdir/leg$i.log"
done
cat > "$tmpdir/m.table" <<EOF
0 16384 mirror core 2 1024 nosync 2 nbd+unix:///?socket=$tmpdir/leg0.sock 0 nbd+unix:///?socket=$tmpdir/leg1.sock 0 1 handle_errors
EOF
start_server m mapper "$tmpdir/m.table"

# reads LEG: the reads leg LEG's server logged.
reads () { grep -c ' Read id=.* count=' "$tmpdir/leg$1.log" || :; }

nbdsh -u "nbd+unix:///?socket=$tmpdir/m.sock" -c '
for i in range(1024):
    h.pread(4096, 65536)
'
r0=$(reads 0) r1=$(reads 1)
echo "reads of one block: leg 0 $r0, leg 1 $r1"
[ $((r0 + r1)) -ge 1024 ] || die "only $((r0 + r1)) reads reached the legs"
[ "$r0" -ge 256 ] && [ "$r1" -ge 256 ] ||
    die "reads not balanced: leg 0 $r0, leg 1 $r1"

# Leg 1 gone (its server killed: it would wait for the mapper's
# connection to close): its reads fail over to leg 0, then it is left out.
kill -9 "$(cat "$tmpdir/leg1.pid")"; rm -f "$tmpdir/leg1.pid"
nbdsh -u "nbd+unix:///?socket=$tmpdir/m.sock" -c '
for i in range(512):
    h.pread(4096, 65536)
'
n0=$(reads 0)
echo "with leg 1 gone: leg 0 served $((n0 - r0)) more"
[ $((n0 - r0)) -ge 512 ] || die "leg 0 served only $((n0 - r0)) of 512 reads"
stop_server m
echo "$0: ok"
