#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The flakey target through a real client, one captive nbdkit per table
# over the same backing file (a restart stands in for a table switch):
# the xfstests power-cut pattern at block level (write + flush while up,
# writes dropped while down with drop_writes, the flushed data is there
# and the dropped writes are not after going back up); error_writes and
# error_reads fail with EIO and change nothing else; no features fails
# everything; corrupt_bio_byte changes exactly one byte of each read.
# "Always up" is down_interval 0, "always down" up_interval 0: nothing
# depends on time.  The same with ext4 and a live reload is
# test-flakey-ext4.sh.
source "${top_srcdir:-$(dirname "$0")/..}/tests/functions.sh"

requires nbdkit --version
requires nbdsh --version

f=$(mkfile f.img 4M)
fill_random "$f" $((4 * 1024 * 1024)) 3
f=$(realpath "$f")
cp "$f" "$tmpdir/orig.img"
len=8000                # sectors: a little short of the file

for t in "up:1 0" "drop:0 1 1 drop_writes" "errw:0 1 1 error_writes" \
         "errr:0 1 1 error_reads" "none:0 1" \
         "corrupt:0 1 5 corrupt_bio_byte 100 r 7 0"; do
    name=${t%%:*}
    echo "0 $len flakey $f 16 ${t#*:}" > "$tmpdir/$name.table"
done

# run TABLE PYTHON: nbdsh against a fresh server on TABLE.  The Python
# has h, S (512), B (the file's original bytes), EIO_check(fn).
run ()
{
    cat > "$tmpdir/prelude.py" <<EOF
import errno
S = 512
B = open("$tmpdir/orig.img", "rb").read()
F = "$f"
def disk(off, n):
    with open(F, "rb") as fp:
        fp.seek(off)
        return fp.read(n)
def fails_eio(what, fn, *args):
    try:
        fn(*args)
    except nbd.Error as e:
        if e.errno not in (errno.EIO, "EIO"):
            raise AssertionError("%s: %r, not EIO" % (what, e))
        return
    raise AssertionError(what + " did not fail")
EOF
    mapper -U - "$tmpdir/$1.table" --run "nbdsh -u \"\$uri\" \
        -c 'exec(open(\"$tmpdir/prelude.py\").read())' -c '$2'" ||
        die "$1: $2"
}

# 1. Up: write and flush A.
run up '
A = b"A" * (64 * 1024 + 3)
h.pwrite(A, 100 * S + 1)
h.flush()
assert h.pread(len(A), 100 * S + 1) == A
'
cp "$f" "$tmpdir/after-A.img"

# 2. Down with drop_writes: writes and zeroes "succeed", nothing lands.
run drop '
Bw = b"B" * (32 * 1024)
h.pwrite(Bw, 100 * S + 1)
h.pwrite(Bw, 2000 * S, nbd.CMD_FLAG_FUA)
h.zero(8 * S, 3000 * S)
h.trim(8 * S, 3100 * S)
h.flush()
assert h.pread(4, 100 * S + 1) == b"AAAA", "read sees the dropped write"
'
cmp "$f" "$tmpdir/after-A.img" || die "drop_writes changed the file"

# 3. Up again: the flushed A is there, the dropped B is not.
run up '
assert h.pread(64 * 1024 + 3, 100 * S + 1) == b"A" * (64 * 1024 + 3)
assert h.pread(32 * 1024, 2000 * S) == B[2016 * S:2016 * S + 32 * 1024]
assert h.pread(8 * S, 3000 * S) == B[3016 * S:3024 * S]
after_a = open("'"$tmpdir"'/after-A.img", "rb").read()
assert h.pread(h.get_size(), 0) == after_a[16 * S:16 * S + h.get_size()]
'

# 4. error_writes: writes, zero, trim and flush fail with EIO; reads work.
run errw '
fails_eio("write", h.pwrite, b"C" * 4096, 0)
fails_eio("fua write", h.pwrite, b"C" * 4096, 0, nbd.CMD_FLAG_FUA)
fails_eio("zero", h.zero, 4096, 0)
fails_eio("trim", h.trim, 4096, 0)
fails_eio("flush", h.flush)
assert h.pread(4096, 50 * S) == disk(66 * S, 4096)
'
cmp "$f" "$tmpdir/after-A.img" || die "error_writes changed the file"

# 5. error_reads: reads fail, writes land.
run errr '
fails_eio("read", h.pread, 512, 0)
fails_eio("unaligned read", h.pread, 3, 7777)
h.pwrite(b"D" * 1000, 5)
h.flush()
assert disk(16 * S + 5, 1000) == b"D" * 1000
'

# 6. No features while down: reads and writes both fail.
cp "$f" "$tmpdir/before-none.img"
run none '
fails_eio("read", h.pread, 512, 0)
fails_eio("write", h.pwrite, b"E" * 512, 0)
fails_eio("flush", h.flush)
'
cmp "$f" "$tmpdir/before-none.img" || die "the default changed the file"

# 7. corrupt_bio_byte 100 r 7: byte 100 of each read is 7, only that.
run corrupt '
for off, n in ((0, 4096), (12345, 100), (777 * S, 65536)):
    got = h.pread(n, off)
    want = bytearray(disk(16 * S + off, n))
    want[99] = 7
    assert got == want, (off, n)
assert h.pread(99, 0) == disk(16 * S, 99), "short read corrupted"
h.pwrite(b"F" * 200, 0)
h.flush()
assert disk(16 * S, 200) == b"F" * 200, "write corrupted"
'

echo "$0: ok"
