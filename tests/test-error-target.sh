#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The error target: every read, write, zero and trim touching it fails with
# EIO, including requests that only partly overlap it; its neighbours keep
# working; the server survives.  Block status does not fail: the error
# range is data (reads there fail, so it is no hole), and nbdinfo --map and
# qemu-img map give exact maps of such devices (the README's holes example).
source "${top_srcdir:-$(dirname "$0")/..}/tests/functions.sh"

requires nbdkit --version
requires python3 -c 'import nbd'

a=$(mkfile a.img 256K)
fill_random "$a" $(( 256 * 1024 )) 5
cp "$a" "$tmpdir/a.orig"

# sectors 0-99 linear, 100-109 error, 110-149 zero, 150-199 linear,
# 200-200 error (a single sector), 201-210 linear.
cat > "$tmpdir/err.table" <<EOF
0 100 linear $a 0
100 10 error
110 40 zero
150 50 linear $a 100
200 1 error
201 10 linear $a 150
EOF

mapper -U - "$tmpdir/err.table" \
       --run "python3 '$top_srcdir/tests/error_target.py' \"\$uri\"" ||
    die "error target test failed"

# The neighbours' writes landed where they should, nothing else changed
# except possibly the bytes of failed writes next to the error target.
python3 - "$a" "$tmpdir/a.orig" <<'EOF'
import sys
S = 512
new, old = open(sys.argv[1], "rb").read(), open(sys.argv[2], "rb").read()
assert len(new) == len(old)
assert new[100 * S - 10:100 * S] == b"L" * 10, "L not in a.img"
assert new[150 * S - 3:150 * S] == b"MMM", "M not in a.img"
assert new[150 * S:150 * S + 3] == bytes(3), "N/zero not in a.img"
# Bytes the test never touched, even with a failing request, are unchanged:
# failing requests only ever reached into [E1-4096, E1end+4900) and
# [E2-3000, E2end+3000) of the device.
touched = [(100 * S - 4096, 100 * S),           # linear 0-99 -> a[0..]
           (100 * S, 100 * S + (200 - 150) * S),  # linear 150-199 -> a[100*S..]
           (150 * S, 150 * S + 3000)]             # linear 201-210 -> a[150*S..]
mask = bytearray(len(new))
for lo, hi in touched:
    for i in range(lo, min(hi, len(new))):
        mask[i] = 1
for i in range(len(new)):
    if not mask[i] and new[i] != old[i]:
        raise SystemExit("a.img byte %d changed unexpectedly" % i)
print("backing check ok")
EOF

# --- block status -------------------------------------------------------
requires nbdinfo --version
requires qemu-img --version

# check_map TABLE LINE...: nbdinfo --map of TABLE's device is LINEs,
# "offset length type description".
check_map ()
{
    local table=$1 want got
    shift
    want=$(printf '%s\n' "$@")
    got=$(mapper -U - "$table" --run 'nbdinfo --map "$uri"' |
              awk '{ print $1, $2, $3, $4 }')
    [ "$got" = "$want" ] ||
        die "nbdinfo --map over ${table##*/}: got
$got
want
$want"
}

# err.table: the random-filled file is data, error is data, zero a hole.
S=512
check_map "$tmpdir/err.table" \
    "0 $((110 * S)) 0 data" \
    "$((110 * S)) $((40 * S)) 3 hole,zero" \
    "$((150 * S)) $((61 * S)) 0 data"

# The README's holes example: a 4 GiB device whose first GiB is a file
# (sparse, with 64 KiB written at 1 MiB), then zero, one MiB of error,
# zero to the end.
f=$(mkfile f.img 1G)
fill_random "$tmpdir/chunk" 65536 9
dd if="$tmpdir/chunk" of="$f" bs=64K seek=16 conv=notrunc status=none
cat > "$tmpdir/holes.table" <<EOF
0        2097152  linear $f 0
2097152  2097152  zero
4194304  2048     error
4196352  4192256  zero
EOF
G=$((1 << 30)) M=$((1 << 20))
check_map "$tmpdir/holes.table" \
    "0 $M 3 hole,zero" \
    "$M 65536 0 data" \
    "$((M + 65536)) $((2 * G - M - 65536)) 3 hole,zero" \
    "$((2 * G)) $M 0 data" \
    "$((2 * G + M)) $((2 * G - M)) 3 hole,zero"

# qemu-img map: the same ranges, as JSON (data, zero).
want=$(printf '%s\n' \
    "0 $M false true" \
    "$M 65536 true false" \
    "$((M + 65536)) $((2 * G - M - 65536)) false true" \
    "$((2 * G)) $M true false" \
    "$((2 * G + M)) $((2 * G - M)) false true")
mapper -U - "$tmpdir/holes.table" \
       --run "qemu-img map -f raw --output=json \"\$uri\" > '$tmpdir/map.json'" ||
    die "qemu-img map over holes.table failed"
got=$(python3 - "$tmpdir/map.json" <<'EOF'
import json, sys
for e in json.load(open(sys.argv[1])):
    print(e["start"], e["length"], str(e["data"]).lower(),
          str(e["zero"]).lower())
EOF
)
[ "$got" = "$want" ] ||
    die "qemu-img map over holes.table: got
$got
want
$want"

echo "$0: ok"
