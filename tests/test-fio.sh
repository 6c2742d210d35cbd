#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# fio's nbd engine with checksum verification on striped devices: random
# mixed I/O, aligned and unaligned block sizes, several concurrent jobs
# (connections), with a non-power-of-two and a power-of-two chunk size.
source "${top_srcdir:-$(dirname "$0")/..}/tests/functions.sh"

requires nbdkit --version
requires fio --version
requires sh -c 'fio --enghelp=nbd 2>&1 | grep -q uri'

# Three stripes, chunk 40 sectors (20K, not a power of two): 1093 chunks
# per stripe = 131160 sectors, a little over 64M.
for f in s0 s1 s2 p0 p1 p2 p3; do mkfile $f.img 32M >/dev/null; done
cat > "$tmpdir/odd.table" <<EOF
0 131160 striped 3 40 $tmpdir/s0.img 0 $tmpdir/s1.img 1 $tmpdir/s2.img 7
EOF
# Four stripes, chunk 128 sectors (64K), 64M, after a 1-sector linear.
cat > "$tmpdir/pow2.table" <<EOF
0 1 linear $tmpdir/p0.img 60000
1 131072 striped 4 128 $tmpdir/p0.img 0 $tmpdir/p1.img 0 $tmpdir/p2.img 0 $tmpdir/p3.img 0
EOF

cat > "$tmpdir/fio.sh" <<'EOF'
set -e
tmpdir=$1 sock=$2
cd "$tmpdir"    # fio may write *.state files into the current directory
common="--ioengine=nbd --direct=1 --verify_state_save=0 --verify=crc32c --do_verify=1
        --verify_fatal=1 --runtime=10 --group_reporting --randrepeat=1"
run ()
{
    echo "=== fio $*"
    fio $common "$@" > "$tmpdir/fio.out" 2>&1 || {
        cat "$tmpdir/fio.out"; exit 1; }
    if grep -Ei 'verify.*(fail|bad)|bad magic|crc32c.*wanted|err= *[1-9]' \
            "$tmpdir/fio.out"; then
        cat "$tmpdir/fio.out"; exit 1
    fi
    grep -E 'READ:|WRITE:' "$tmpdir/fio.out" || :
}
for dev in odd pow2; do
    uri="nbd+unix:///$dev?socket=$sock"
    # Mixed random 4K I/O over 64M.
    run --name=randrw-$dev --uri="$uri" --rw=randrw --bs=4k --size=64M \
        --iodepth=16 --io_size=16M
    # Unaligned block sizes: 3584-byte blocks straddle every chunk edge.
    run --name=odd-bs-$dev --uri="$uri" --rw=randwrite --bs=3584 \
        --size=32M --io_size=8M --iodepth=8
    # Block size range, sequential write then verify.
    run --name=bsrange-$dev --uri="$uri" --rw=write --bsrange=512-128k \
        --size=16M --offset=5M --iodepth=4
    # Four jobs = four connections, each on its own 16M slice.
    run --name=multi-$dev --uri="$uri" --rw=randrw --bs=8k --size=16M \
        --offset_increment=16M --numjobs=4 --iodepth=8 --io_size=4M
done
# Keep a copy of what the devices read as, to check against the backing
# files after the server is gone.
nbdcopy "nbd+unix:///odd?socket=$sock" "$tmpdir/odd.out"
nbdcopy "nbd+unix:///pow2?socket=$sock" "$tmpdir/pow2.out"
EOF

mapper -U - "$tmpdir/odd.table" "$tmpdir/pow2.table" \
       --run "bash '$tmpdir/fio.sh' '$tmpdir' \"\$unixsocket\"" ||
    die "fio failed"

# Reassemble both devices from their backing files with the dm-stripe rule
# and compare with what the clients read.
python3 - "$tmpdir" <<'PYEOF'
import sys
d = sys.argv[1]
S = 512
def stripe(out, start, nchunks, chunk, areas):
    files = [open("%s/%s" % (d, f), "rb") for f, o in areas]
    for c in range(nchunks):
        i, row = c % len(areas), c // len(areas)
        files[i].seek((areas[i][1] + row * chunk) * S)
        want = files[i].read(chunk * S)
        got = out[(start + c * chunk) * S:(start + (c + 1) * chunk) * S]
        if got != want:
            raise SystemExit("chunk %d (stripe %d) differs from %s"
                             % (c, i, areas[i][0]))
odd = open(d + "/odd.out", "rb").read()
assert len(odd) == 131160 * S
stripe(odd, 0, 131160 // 40, 40, [("s0.img", 0), ("s1.img", 1), ("s2.img", 7)])
pow2 = open(d + "/pow2.out", "rb").read()
assert len(pow2) == 131073 * S
with open(d + "/p0.img", "rb") as f:
    f.seek(60000 * S)
    assert pow2[:S] == f.read(S), "pow2 sector 0"
stripe(pow2, 1, 131072 // 128, 128,
       [("p0.img", 0), ("p1.img", 0), ("p2.img", 0), ("p3.img", 0)])
print("devices match their backing files")
PYEOF

echo "$0: ok"
