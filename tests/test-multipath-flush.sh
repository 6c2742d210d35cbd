#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# A write that fails on one multipath path and is retried on another,
# then a client flush: counted on the servers (nbdkit's log filter), the
# flush reaches both.  Path a (group 1) fails every write (the error
# filter); path b (group 2) takes the retry.  a is also the backend of
# a linear line of the same table, so its flushes are the engine's
# shared bookkeeping (flush.c), which must count the failed attempt as a
# write (it may have written part); b's are the multipath's own rule.
source "${top_srcdir:-$(dirname "$0")/..}/tests/functions-mpath.sh"

requires nbdkit --version
requires nbdkit --filter=log --filter=error null --version
requires python3 -c 'import nbd'

disk=$(mkfile disk.img 4M)
kit a "$disk" --filter=log --filter=error logfile="$tmpdir/a.log" \
    error-pwrite=EIO error-pwrite-rate=1
kit b "$disk" --filter=log logfile="$tmpdir/b.log"
A=$(kit_uri a) B=$(kit_uri b)
flushes () { grep -c ' Flush id=' "$tmpdir/$1.log" || :; }

cat > "$tmpdir/m.table" <<TABLE
0 4096 multipath 0 0 2 1 round-robin 0 1 0 $A round-robin 0 1 0 $B
4096 4096 linear $A 4096
TABLE
start_mapper "$tmpdir/m.table"
a0=$(flushes a) b0=$(flushes b)
timeout 60 python3 - "$dev_uri" <<'PY' || die "the write or the flush failed"
import sys, nbd
h = nbd.NBD()
h.connect_uri(sys.argv[1])
h.pwrite(b"\x5a" * 4096, 65536)
h.flush()
PY
logged "path $(re "$A") failed \(I/O error\)"
a=$(($(flushes a) - a0)) b=$(($(flushes b) - b0))
echo "flushes after the write: a $a, b $b"
[ "$b" -ge 1 ] || die "the flush did not reach path b, which took the write"
[ "$a" -ge 1 ] || die "the flush did not reach a, which failed the write (it may have written part)"
echo "$0: ok"
