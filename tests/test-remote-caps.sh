#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# What a remote backend can't do: a read-only server makes the device
# read-only (writes fail with EPERM); a server without write-zeroes, FUA
# or extents still gets zeroes (written), FUA writes (emulated with a
# flush) and extents (all data); fast zero is not offered.
source "${top_srcdir:-$(dirname "$0")/..}/tests/functions.sh"

requires nbdkit --version
requires python3 -c 'import nbd'
requires nbdinfo --version
requires nbdkit --filter=nozero --filter=fua --filter=noextents null --version

start_server ro -r memory 1M
start_server plain --filter=nozero --filter=fua --filter=noextents memory 1M \
    zeromode=none
echo "0 2048 linear nbd+unix:///?socket=$tmpdir/ro.sock 0" > "$tmpdir/ro.table"
echo "0 2048 linear nbd+unix:///?socket=$tmpdir/plain.sock 0" > "$tmpdir/plain.table"

mapper -U - "$tmpdir/ro.table" "$tmpdir/plain.table" \
       --run "python3 '$top_srcdir/tests/remote_caps.py' \"\$unixsocket\" 'nbd+unix:///?socket=$tmpdir/plain.sock'" ||
    die "remote capabilities"
echo "$0: ok"
