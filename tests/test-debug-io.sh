#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# -D mapper.io=1 logs how each request is split: a request spanning two
# targets names the device and both backing files (or "clone"s); without
# the flag nothing of the sort is logged.
source "${top_srcdir:-$(dirname "$0")/..}/tests/functions.sh"

requires nbdkit --version
requires nbdsh --version

a=$(mkfile first-backing.img 1M)
b=$(mkfile second-backing.img 1M)
c=$(mkfile third-backing.img 1M)
cat > "$tmpdir/spandev.table" <<EOF
0 100 linear $a 7
100 50 linear $b 0
EOF
cat > "$tmpdir/stripedev.table" <<EOF
0 60 striped 2 3 $b 500 $c 100
EOF

# Read 1024 bytes straddling the edge at sector 100; write 2000 bytes over
# a chunk edge of the striped device; flush both.
run='nbdsh -u "$uri" -c "h.pread(1024, 100*512 - 512); h.flush()" &&
     nbdsh -u "nbd+unix:///stripedev?socket=$unixsocket" \
           -c "h.pwrite(b\"x\" * 2000, 3*512 - 1000); h.flush()"'

mapper -f -v -D mapper.io=1 -U - "$tmpdir/spandev.table" \
       "$tmpdir/stripedev.table" --run "$run" 2> "$tmpdir/log" ||
    { cat "$tmpdir/log"; die "nbdkit -D mapper.io=1 failed"; }

# Plugin debug lines mentioning the device, other than nbdkit's own
# per-callback tracing ("debug: mapper: pread ...").
grep 'debug:' "$tmpdir/log" | grep -v 'debug: mapper: ' > "$tmpdir/io" || :
echo "--- I/O debug lines:"
grep -E 'spandev|stripedev' "$tmpdir/io" || :

span=$(grep 'spandev' "$tmpdir/io" | grep -Ei 'read|pread' || :)
[ -n "$span" ] || die "no debug line for the spanning read on spandev"
if ! { grep -q 'first-backing.img' <<<"$span" &&
       grep -q 'second-backing.img' <<<"$span"; }; then
    grep -qi 'clone' <<<"$span" ||
        die "the spanning read's debug line shows no split"
fi
# The numbers of the request: offset 50688, count 1024.
grep -q '50688' <<<"$span" || die "spanning read: offset 50688 not logged"
grep -q '1024' <<<"$span" || die "spanning read: count 1024 not logged"

str=$(grep 'stripedev' "$tmpdir/io" | grep -Ei 'write' || :)
[ -n "$str" ] || die "no debug line for the write on stripedev"
if ! { grep -q 'second-backing.img' <<<"$str" &&
       grep -q 'third-backing.img' <<<"$str"; }; then
    grep -qi 'clone' <<<"$str" ||
        die "the striped write's debug line shows no split"
fi

grep -Ei 'spandev|stripedev' "$tmpdir/io" | grep -qi 'flush' ||
    die "no flush debug line"

# Without -D mapper.io=1 (still verbose), no split lines.
mapper -f -v -U - "$tmpdir/spandev.table" "$tmpdir/stripedev.table" \
       --run "$run" 2> "$tmpdir/log2" ||
    { cat "$tmpdir/log2"; die "nbdkit -v failed"; }
if grep 'debug:' "$tmpdir/log2" | grep -v 'debug: mapper: ' |
        grep -E 'spandev|stripedev' | grep -qE 'clone|backing\.img'; then
    die "split lines logged without -D mapper.io=1"
fi

echo "$0: ok"
