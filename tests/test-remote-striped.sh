#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# A striped device over three remote backends (nbdkit file on a Unix
# socket, nbdkit file over TCP 127.0.0.1, qemu-nbd on a Unix socket) and
# one local file: random data copied in is read back identical, every
# chunk is where dm-stripe puts it in the backing files, and fio verifies
# mixed random I/O through it.
source "${top_srcdir:-$(dirname "$0")/..}/tests/functions.sh"

requires nbdkit --version
requires nbdcopy --version
requires qemu-nbd --version
requires fio --version
requires sh -c 'fio --enghelp=nbd 2>&1 | grep -q uri'

for f in r0 r1 r2 l3; do mkfile $f.img 9M >/dev/null; done
port=$(free_port)
start_server r0 file "$tmpdir/r0.img"
start_server r1 -i 127.0.0.1 -p "$port" file "$tmpdir/r1.img"
start_qemu_nbd r2 "$tmpdir/r2.img"

# 4 stripes x 4M, chunk 24 sectors (12K: not a power of two), each area
# at a different offset of its backend.
cat > "$tmpdir/s.table" <<EOF
0 32736 striped 4 24 nbd+unix:///?socket=$tmpdir/r0.sock 8 nbd://127.0.0.1:$port 0 nbd+unix:///?socket=$tmpdir/r2.sock 100 $tmpdir/l3.img 16
EOF
size=$((32736 * 512))
fill_random "$tmpdir/in" "$size" 7

cat > "$tmpdir/run.sh" <<'EOF'
set -e
tmpdir=$1 uri=$2
nbdcopy "$tmpdir/in" "$uri"
nbdcopy "$uri" "$tmpdir/out"
cmp "$tmpdir/in" "$tmpdir/out"
cd "$tmpdir"
fio --name=remote --ioengine=nbd --uri="$uri" --rw=randrw --bs=4k \
    --bsrange=512-64k --io_size=6M --iodepth=32 --numjobs=2 \
    --offset_increment=8M --size=8M \
    --verify=crc32c --do_verify=1 --verify_fatal=1 --verify_state_save=0 \
    --group_reporting > "$tmpdir/fio.out" 2>&1 || { cat "$tmpdir/fio.out"; exit 1; }
if grep -Ei 'verify.*(fail|bad)|bad magic|err= *[1-9]' "$tmpdir/fio.out"; then
    cat "$tmpdir/fio.out"; exit 1
fi
grep -E 'READ:|WRITE:' "$tmpdir/fio.out"
nbdcopy "$uri" "$tmpdir/out"
EOF

mapper -U - "$tmpdir/s.table" \
       --run "bash '$tmpdir/run.sh' '$tmpdir' \"\$uri\"" ||
    die "striped remote device"
# The servers are gone: everything reached the backing files.
stop_server r0; stop_server r1; stop_server r2

python3 - "$tmpdir" <<'PYEOF'
import sys
d = sys.argv[1]
S, chunk = 512, 24
areas = [("r0.img", 8), ("r1.img", 0), ("r2.img", 100), ("l3.img", 16)]
out = open(d + "/out", "rb").read()
files = [open("%s/%s" % (d, f), "rb") for f, o in areas]
for c in range(32736 // chunk):
    i, row = c % 4, c // 4
    files[i].seek((areas[i][1] + row * chunk) * S)
    if files[i].read(chunk * S) != out[c * chunk * S:(c + 1) * chunk * S]:
        raise SystemExit("chunk %d differs in %s" % (c, areas[i][0]))
print("every chunk is in its backing file")
PYEOF

echo "$0: ok"
