#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Real clients copying whole devices: qemu-img convert/compare and nbdcopy,
# into and out of a device mixing linear, striped and zero targets.
source "${top_srcdir:-$(dirname "$0")/..}/tests/functions.sh"

requires nbdkit --version
requires qemu-img --version
requires nbdcopy --version
requires cmp --version

# Backing files, sparse, bigger than needed.
for f in A B S0 S1 S2; do mkfile $f.img 8M >/dev/null; done
# 2M linear, 6M striped (3 x 2M, chunk 7 sectors... must divide 4096:
# use chunk 16 = 8K), 1M zero, 1M linear, 3M striped with odd chunk.
# sizes in sectors: 4096 linear, 12288 striped 3 16, 2048 zero,
# 2048 linear, 6120 striped 3 5 (2040 per stripe = 408 chunks of 5).
cat > "$tmpdir/dev.table" <<EOF
0     4096  linear  $tmpdir/A.img 3
4096  12288 striped 3 16 $tmpdir/S0.img 0 $tmpdir/S1.img 8 $tmpdir/S2.img 1
16384 2048  zero
18432 2048  linear  $tmpdir/B.img 0
20480 6120  striped 3 5 $tmpdir/S0.img 5000 $tmpdir/S1.img 5000 $tmpdir/B.img 3000
EOF
size=$(( 26600 * 512 ))
zlo=$(( 16384 * 512 )); zhi=$(( 18432 * 512 ))

# The reference: random data, with zeroes where the zero target is (writes
# there are dropped) and some zero runs elsewhere (so sparse-aware copies
# have something to skip).
python3 - "$tmpdir/ref.raw" "$size" "$zlo" "$zhi" <<'EOF'
import random, sys
path, size, zlo, zhi = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rng = random.Random(42)
data = bytearray(rng.randbytes(size))
data[zlo:zhi] = bytes(zhi - zlo)
for i in range(20):
    a = rng.randrange(size)
    n = rng.choice([1, 4096, 65536, 200000])
    data[a:a + n] = bytes(len(data[a:a + n]))
open(path, "wb").write(data)
EOF
python3 - "$tmpdir/ref2.raw" "$size" "$zlo" "$zhi" <<'EOF'
import random, sys
path, size, zlo, zhi = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
data = bytearray(random.Random(43).randbytes(size))
data[zlo:zhi] = bytes(zhi - zlo)
open(path, "wb").write(data)
EOF

cat > "$tmpdir/copy.sh" <<'EOF'
set -e
tmpdir=$1 uri=$2
echo "device: $uri"
qemu-img info "$uri"
# qemu-img: into the device, compare, out of the device.
qemu-img convert -n -f raw -O raw "$tmpdir/ref.raw" "$uri"
qemu-img compare -f raw -F raw "$tmpdir/ref.raw" "$uri"
qemu-img convert -f raw -O raw "$uri" "$tmpdir/out1.raw"
cmp "$tmpdir/ref.raw" "$tmpdir/out1.raw"
# nbdcopy: into the device (different data), out, compare.
nbdcopy "$tmpdir/ref2.raw" "$uri"
nbdcopy "$uri" "$tmpdir/out2.raw"
cmp "$tmpdir/ref2.raw" "$tmpdir/out2.raw"
qemu-img compare -f raw -F raw "$tmpdir/ref2.raw" "$uri"
# Streaming through a pipe, several connections and requests in flight.
nbdcopy --connections=4 --requests=16 --request-size=65536 "$uri" - |
    cmp - "$tmpdir/ref2.raw"
nbdcopy --connections=4 --requests=16 --request-size=4096 \
        "$tmpdir/ref.raw" "$uri"
nbdcopy --synchronous "$uri" - | cmp - "$tmpdir/ref.raw"
# A copy where the source is sparse: nbdcopy zeroes/trims the device.
truncate -s "$(stat -c %s "$tmpdir/ref.raw")" "$tmpdir/sparse.raw"
python3 -c '
import sys
f = open(sys.argv[1], "r+b")
for off in (0, 3000000, 10000000, 13000000):  # not in the zero target
    f.seek(off); f.write(b"sparse-data" * 100)
' "$tmpdir/sparse.raw"
nbdcopy "$tmpdir/sparse.raw" "$uri"
qemu-img compare -f raw -F raw "$tmpdir/sparse.raw" "$uri"
nbdcopy "$uri" - | cmp - "$tmpdir/sparse.raw"
# Leave ref.raw on the device for the backing file check.
qemu-img convert -n -f raw -O raw "$tmpdir/ref.raw" "$uri"
qemu-img compare -f raw -F raw "$tmpdir/ref.raw" "$uri"
EOF

mapper -U - "$tmpdir/dev.table" --run "bash '$tmpdir/copy.sh' '$tmpdir' \"nbd+unix:///dev?socket=\$unixsocket\"" ||
    die "copy test failed"

# Spot-check the linear targets in the backing files.
cmp -n $(( 4096 * 512 )) "$tmpdir/ref.raw" "$tmpdir/A.img" 0 $(( 3 * 512 )) ||
    die "A.img does not hold device sectors 0-4095"
cmp -n $(( 2048 * 512 )) "$tmpdir/ref.raw" "$tmpdir/B.img" $(( 18432 * 512 )) 0 ||
    die "B.img does not hold device sectors 18432-20479"
# ... and one chunk of each stripe of the first striped target.
C=$(( 16 * 512 ))
cmp -n $C "$tmpdir/ref.raw" "$tmpdir/S0.img" $(( 4096 * 512 )) 0 || die "S0 chunk 0"
cmp -n $C "$tmpdir/ref.raw" "$tmpdir/S1.img" $(( 4096 * 512 + C )) $(( 8 * 512 )) || die "S1 chunk 1"
cmp -n $C "$tmpdir/ref.raw" "$tmpdir/S2.img" $(( 4096 * 512 + 2 * C )) 512 || die "S2 chunk 2"
cmp -n $C "$tmpdir/ref.raw" "$tmpdir/S0.img" $(( 4096 * 512 + 3 * C )) $C || die "S0 chunk 3"

echo "$0: ok"
