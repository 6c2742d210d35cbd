#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Where a multipath device's requests go, counted on the servers (nbdkit
# file with the log filter, over one file), not by the mapper:
#
#  1. round-robin spreads sequential reads evenly over two paths, and by
#     their repeat counts (3 and 1) when given;
#  2. two priority groups: requests go to group 1; when its server is
#     killed they go to group 2; once the checker has reinstated group
#     1's path they stay on group 2 (failback manual, multipathd's
#     default) until switch_group 1;
#  3. with failback immediate they go back to group 1 by themselves.
source "${top_srcdir:-$(dirname "$0")/..}/tests/functions-mpath.sh"

requires nbdkit --version
requires nbdkit --filter=log null --version
requires python3 -c 'import nbd'

disk=$(mkfile disk.img 4M)
fill_random "$disk" 4194304 3
# logkit NAME: nbdkit file with the log filter (log in $tmpdir/NAME.log,
# started afresh; the section before's server NAME is stopped first: a
# second one would take over the pid file and the first be left running).
logkit ()
{
    [ ! -s "$tmpdir/$1.pid" ] || stop_server "$1"
    rm -f "$tmpdir/$1.log"
    kit "$1" "$disk" --filter=log logfile="$tmpdir/$1.log"
}
logkit a
logkit b
A=$(kit_uri a) B=$(kit_uri b)

# reads N: N sequential 4 KiB reads of device m at 1 MiB onwards.
reads ()
{
    timeout 60 python3 - "$dev_uri" "$1" <<'PY' || die "reads failed"
import sys, nbd
h = nbd.NBD()
h.connect_uri(sys.argv[1])
for i in range(int(sys.argv[2])):
    h.pread(4096, (1 << 20) + 4096 * (i % 256))
PY
}
# count NAME: the client reads (at 1 MiB onwards, not the checker's
# probes at 0) server NAME has logged.
count ()
{
    grep ' Read id=' "$tmpdir/$1.log" | grep -vc 'offset=0x0 ' || :
}
# expect A B: the counts of servers a and b.
expect ()
{
    [ "$(count a)" = "$1" ] && [ "$(count b)" = "$2" ] ||
        die "reads on a and b: $(count a) and $(count b), expected $1 and $2"
    echo "reads on a and b: $1 and $2"
}

# --- 1. round-robin ---------------------------------------------------------
echo "0 8192 multipath 0 0 1 1 round-robin 0 2 0 $A $B" > "$tmpdir/m.table"
start_mapper "$tmpdir/m.table"
reads 200
expect 100 100
stop_server ctl
echo "0 8192 multipath 0 0 1 1 round-robin 0 2 1 $A 3 $B 1" > "$tmpdir/m.table"
start_mapper "$tmpdir/m.table"
reads 200
expect 250 150
stop_server ctl

# --- 2. priority groups, failback manual -----------------------------------
logkit a
logkit b
echo "0 8192 multipath 2 checker_interval_msecs 200 0 2 1 round-robin 0 1 0 $A round-robin 0 1 0 $B" \
    > "$tmpdir/m.table"
start_mapper "$tmpdir/m.table" remote-timeout=600
reads 10
expect 10 0
kill9 a
reads 10                        # after the path timeout: group 2
expect 10 10
status_ends " 2 2 E 0 1 0 $A F 1 A 0 1 0 $B A 0"
logkit a
wait_path "$A" A
reads 10
expect 0 20                     # manual: group 2 stays
status_ends " 2 2 E 0 1 0 $A A 1 A 0 1 0 $B A 0"
ms message m 0 switch_group 1
reads 10
expect 10 20
status_ends " 2 1 A 0 1 0 $A A 1 E 0 1 0 $B A 0"
stop_server ctl

# --- 3. failback immediate ---------------------------------------------------
logkit a
logkit b
echo "0 8192 multipath 4 checker_interval_msecs 200 failback immediate 0 2 1 round-robin 0 1 0 $A round-robin 0 1 0 $B" \
    > "$tmpdir/m.table"
start_mapper "$tmpdir/m.table" remote-timeout=600
reads 10
kill9 a
reads 10
expect 10 10
logkit a
wait_path "$A" A
reads 10
expect 10 10                    # back on group 1 (a's new log)
status_ends " 2 1 A 0 1 0 $A A 1 E 0 1 0 $B A 0"
echo "$0: ok"
