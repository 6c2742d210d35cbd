#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The crypt target against an independent dm-crypt implementation
# (tests/crypt-reference.py: XTS built from `openssl enc -aes-*-ecb`): for
# each cipher, key size, IV mode, sector size, iv_large_sectors, iv_offset
# and device offset,
#   - data written through the device (aligned and not) is on the
#     backing file exactly as the reference encrypts it;
#   - an image encrypted by the reference (as Linux would have written it)
#     reads back as its plaintext;
#   - zero writes encrypted zeros (not a hole);
#   - trim reaches the file only with allow_discards, whole sectors only.
# Then fio with verification over a crypt device, unaligned block sizes
# included.  With nbdmsetup built, `table` masks the key unless
# --showkeys.
source "${top_srcdir:-$(dirname "$0")/..}/tests/functions.sh"

requires nbdkit --version
requires nbdsh --version
requires nbdcopy --version
requires openssl version
requires sh -c 'head -c 16 /dev/zero | openssl enc -aes-128-ecb -nopad -K 00000000000000000000000000000000 >/dev/null'
requires cmp --version

ref=$top_srcdir/tests/crypt-reference.py
S=512

# on_disk_is PLAIN SUFFIX MESSAGE, from check (it uses check's locals): the
# target's area of the backing file must be PLAIN as the reference encrypts
# it; the copies are $name.disk$SUFFIX and $name.want$SUFFIX.
on_disk_is ()
{
    dd if="$f" of="$tmpdir/$name.disk$2" bs=$S skip="$devoff" count=$sectors \
       status=none
    python3 "$ref" encrypt "$cipher" "$key" "$ivoff" "$ss" "$large" \
        "$1" "$tmpdir/$name.want$2"
    cmp "$tmpdir/$name.want$2" "$tmpdir/$name.disk$2" || die "$name: $3"
}

# check NAME CIPHER KEYBYTES IV_OFFSET DEV_OFFSET SECTOR_SIZE IV_LARGE [OPTS]
check ()
{
    local name=$1 cipher=$2 keybytes=$3 ivoff=$4 devoff=$5 ss=$6 large=$7
    local opts=${8:-} key sectors=4096 f
    key=$(python3 -c "import os; print(os.urandom($keybytes).hex())")
    f=$(mkfile "$name.img" 4M)
    f=$(realpath "$f")
    echo "0 $sectors crypt $cipher $key $ivoff $f $devoff $opts" \
        > "$tmpdir/$name.table"
    fill_random "$tmpdir/$name.plain" $((sectors * S)) "$RANDOM"

    # 1. Write through the device, unaligned pieces first, then the rest
    #    with nbdcopy; then read back everything.
    mapper -U - "$tmpdir/$name.table" --run '
        nbdsh -u "$uri" -c "
d = open(\"'"$tmpdir/$name.plain"'\", \"rb\").read()
cuts = [0, 1, 511, 513, 4095, 4097, 5000, 12289, 70001, 300000]
for a, b in zip(cuts, cuts[1:]):
    h.pwrite(d[a:b], a)
h.pwrite(d[300000:], 300000, nbd.CMD_FLAG_FUA)
h.flush()
assert h.pread(len(d), 0) == d, \"read back differs\"
assert h.pread(3, 4094) == d[4094:4097]
" && nbdcopy "$uri" "'"$tmpdir/$name.back"'"' ||
        die "$name: I/O through the device failed"
    cmp "$tmpdir/$name.plain" "$tmpdir/$name.back" ||
        die "$name: nbdcopy read back differs"
    on_disk_is "$tmpdir/$name.plain" "" \
        "the backing file is not what dm-crypt writes"
    # Nothing outside the target's area was touched.
    python3 -c "
import sys
d = open('$f', 'rb').read()
a, b = $devoff * $S, ($devoff + $sectors) * $S
sys.exit(d[:a] != bytes(a) or d[b:] != bytes(len(d) - b))" ||
        die "$name: bytes outside the target's area changed"

    # 2. The other way: an image encrypted by the reference reads back.
    fill_random "$tmpdir/$name.plain2" $((sectors * S)) "$RANDOM"
    python3 "$ref" encrypt "$cipher" "$key" "$ivoff" "$ss" "$large" \
        "$tmpdir/$name.plain2" "$tmpdir/$name.enc2"
    dd if="$tmpdir/$name.enc2" of="$f" bs=$S seek="$devoff" conv=notrunc \
       status=none
    mapper -U - "$tmpdir/$name.table" \
        --run 'nbdcopy "$uri" "'"$tmpdir/$name.back2"'"' ||
        die "$name: nbdcopy failed"
    cmp "$tmpdir/$name.plain2" "$tmpdir/$name.back2" ||
        die "$name: does not decrypt what dm-crypt wrote"

    # 3. Zero: encrypted zeros on the file (not a hole, not zeros); and
    #    trim.
    mapper -U - "$tmpdir/$name.table" --run '
        nbdsh -u "$uri" -c "
h.zero(64 * 1024, 8192)
h.zero(1000, 100000 + 3)
h.flush()
assert h.pread(64 * 1024, 8192) == bytes(64 * 1024)
" && nbdcopy "$uri" "'"$tmpdir/$name.back3"'"' || die "$name: zero failed"
    python3 - "$tmpdir/$name.plain2" "$tmpdir/$name.exp3" <<'EOF'
import sys
d = bytearray(open(sys.argv[1], "rb").read())
d[8192:8192 + 65536] = bytes(65536)
d[100003:101003] = bytes(1000)
open(sys.argv[2], "wb").write(d)
EOF
    cmp "$tmpdir/$name.exp3" "$tmpdir/$name.back3" ||
        die "$name: zero: wrong data read back"
    on_disk_is "$tmpdir/$name.exp3" 3 "zero did not write encrypted zeros"

    cp "$f" "$tmpdir/$name.before-trim"
    mapper -U - "$tmpdir/$name.table" --run '
        nbdsh -u "$uri" -c "
before = h.pread(300000, 0)
h.trim(200000, 50001)
h.flush()
after = h.pread(300000, 0)
assert after[:50001] == before[:50001], \"trim touched bytes before it\"
assert after[250001:] == before[250001:], \"trim touched bytes after it\"
"' || die "$name: trim failed"
    python3 - "$f" "$tmpdir/$name.before-trim" "$devoff" "$ss" \
              "$(case "$opts" in *allow_discards*) echo 1;; *) echo 0;; esac)" \
              <<'EOF' || die "$name: trim checks"
import sys
f, before, devoff, ss, discards = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1"
a = open(f, "rb").read()
b = open(before, "rb").read()
base = devoff * 512
first = (50001 + ss - 1) // ss * ss
last = 250001 // ss * ss
if not discards:
    assert a == b, "trim without allow_discards changed the file"
else:
    assert a[:base + first] == b[:base + first], "trim: partial sector before"
    assert a[base + first:base + last] == bytes(last - first), "trim: not punched"
    assert a[base + last:] == b[base + last:], "trim: partial sector after"
EOF
    echo "$name: ok"
}

check plain64-512   aes-xts-plain64 64 0   0   512  0
check plain-256     aes-xts-plain   32 0   0   512  0
check plain64be     aes-xts-plain64be 64 5 3   512  0 "1 allow_discards"
check ivoff-large   aes-xts-plain64 32 1000 17 512  0
# plain wraps at 2^32 sectors: an iv_offset just below it wraps inside.
check plain-wrap    aes-xts-plain   64 4294967290 0 512 0
check ss4096        aes-xts-plain64 64 8   8   4096 0 "1 sector_size:4096"
check ss4096-large  aes-xts-plain64 64 16  16  4096 1 "3 allow_discards sector_size:4096 iv_large_sectors"
check ss1024-large  aes-xts-plain   32 2   6   1024 1 "2 iv_large_sectors sector_size:1024"
check capi          "capi:xts(aes)-plain64" 64 0 0 512 0 "1 allow_discards"

# fio with verification, several connections, unaligned block sizes.
if fio --enghelp=nbd 2>&1 | grep -q uri; then
    f=$(realpath "$(mkfile fio.img 64M)")
    key=$(python3 -c "import os; print(os.urandom(64).hex())")
    echo "0 131072 crypt aes-xts-plain64 $key 0 $f 0 1 sector_size:4096" \
        > "$tmpdir/fio.table"
    cat > "$tmpdir/fio.sh" <<'EOF'
set -e
tmpdir=$1 uri=$2
cd "$tmpdir"
common="--ioengine=nbd --uri=$uri --direct=1 --verify_state_save=0
        --verify=crc32c --do_verify=1 --verify_fatal=1 --group_reporting
        --randrepeat=1"
run ()
{
    echo "=== fio $*"
    fio $common "$@" > fio.out 2>&1 || { cat fio.out; exit 1; }
    if grep -Ei 'verify.*(fail|bad)|bad magic|crc32c.*wanted|err= *[1-9]' fio.out; then
        cat fio.out; exit 1
    fi
    grep -E 'READ:|WRITE:' fio.out || :
}
run --name=randrw --rw=randrw --bs=4k --size=64M --iodepth=16 --io_size=16M
run --name=odd --rw=randwrite --bs=3584 --size=32M --io_size=4M --iodepth=8
run --name=range --rw=write --bsrange=512-128k --size=16M --offset=5M \
    --iodepth=4
run --name=multi --rw=randrw --bs=8k --size=16M --offset_increment=16M \
    --numjobs=4 --iodepth=8 --io_size=4M
EOF
    mapper -U - "$tmpdir/fio.table" \
        --run "bash '$tmpdir/fio.sh' '$tmpdir' \"\$uri\"" || die "fio"
fi

# With the control plane: the key is masked unless --showkeys.
: "${NBDMSETUP:=$top_builddir/client-tools/nbdmsetup/nbdmsetup}"
if [ -x "$NBDMSETUP" ]; then
    sock=$tmpdir/sec.sock
    f=$(realpath "$(mkfile ms.img 1M)")
    key=$(python3 -c "import os; print(os.urandom(64).hex())")
    echo "0 2048 crypt aes-xts-plain64 $key 0 $f 0" > "$tmpdir/sec.table"
    start_server sec mapper "$tmpdir/sec.table"
    ms () { "$NBDMSETUP" -a "nbd+unix:///control?socket=$sock" "$@"; }
    ms table sec > "$tmpdir/masked"
    ms table --showkeys sec > "$tmpdir/shown"
    cat "$tmpdir/masked"
    grep -q "$key" "$tmpdir/masked" && die "table shows the key"
    grep -q "crypt aes-xts-plain64 0\{128\} 0 $f 0" "$tmpdir/masked" ||
        die "masked table line unexpected"
    grep -q "crypt aes-xts-plain64 $key 0 $f 0" "$tmpdir/shown" ||
        die "--showkeys does not show the key"
fi

echo "$0: ok"
