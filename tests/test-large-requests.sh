#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Large requests: 64M reads/writes spanning many targets and chunks, zero
# and trim of (almost) 4G, block status over a device larger than 4G.
source "${top_srcdir:-$(dirname "$0")/..}/tests/functions.sh"

requires nbdkit --version
requires python3 -c 'import nbd'

for f in L S0 S1 S2; do mkfile $f.img 48M >/dev/null; done
# 40M linear, 24M striped (3 x 8M, chunk 9 sectors: 3 * 16380 sectors),
# 8G zero, 8M linear.
cat > "$tmpdir/large.table" <<EOF
0        81920    linear  $tmpdir/L.img 0
81920    49140    striped 3 9 $tmpdir/S0.img 0 $tmpdir/S1.img 0 $tmpdir/S2.img 0
131060   16777216 zero
16908276 16384    linear  $tmpdir/L.img 81920
EOF

mapper -U - "$tmpdir/large.table" --run "python3 '$top_srcdir/tests/large_requests.py' \"\$uri\"" ||
    die "large requests"

echo "$0: ok"
