#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# A remote backend's lost writes are reported to every client connection
# that was open when they were lost, once each (Linux errseq semantics),
# not to whichever connection flushes first; connections opened later
# are not affected; the same through a device stacked on it.
source "${top_srcdir:-$(dirname "$0")/..}/tests/functions.sh"
requires nbdsh --version
requires python3 -c 'import nbd'

f=$(mkfile r.img 16M)
start_server r file "$f"
echo "0 32768 linear nbd+unix:///?socket=$tmpdir/r.sock 0" > "$tmpdir/d.table"
echo "0 32768 linear mapper:d 0" > "$tmpdir/up.table"
sock=$tmpdir/mapper.sock
start_server mapper mapper remote-timeout=20 \
    remote-connections=4 "$tmpdir/d.table" "$tmpdir/up.table"

python3 "$top_srcdir/tests/remote_errseq.py" "$sock" "$tmpdir" "$f"
echo "$0: ok"
