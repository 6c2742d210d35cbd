#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Bad input that nbdmsetup or the server used to take in silence, or
# reported in the wrong terms: each is refused, the message names the
# place (file and line or byte offset, the option, the limit), and
# nothing changes.  Also: stale temporary table files are removed at
# start.
source "$(dirname "$0")/functions-ms.sh"

requires nbdinfo --version

a=$(mkfile a.img 1M)
mkdir "$tmpdir/tables"
echo "0 2048 linear $a 0" > "$tmpdir/tables/d1.table"
start_server ctl mapper tables="$tmpdir/tables"

snapshot () { { ms ls; ms table; ms table --inactive; ms info; ls -a "$tmpdir/tables"; cat "$tmpdir/tables"/*.table; } 2>&1; }
before=$(snapshot)
unchanged () { [ "$(snapshot)" = "$before" ] || die "state changed after: $*"; }

# --- A table file with a NUL byte: refused by nbdmsetup as by the server
# start, naming the file and the offset (not cut there and loaded).
printf '0 8 zero\n\000junk\n' > "$tmpdir/nul.table"
for c in create load reload replace; do
    n=d1; [ $c = create ] && n=n1
    fails "^nbdmsetup: $tmpdir/nul.table: table contains a NUL byte at offset 9$" \
        ms $c $n "$tmpdir/nul.table"
done
fails '^nbdmsetup: stdin: table contains a NUL byte at offset 9$' \
    ms load d1 - < "$tmpdir/nul.table"
unchanged nul
mkdir "$tmpdir/nuldir"
cp "$tmpdir/nul.table" "$tmpdir/nuldir/"
mapper_refuses "nul.table: table contains a NUL byte at offset 9" \
    tables="$tmpdir/nuldir"
# ... and a batch line with one is not run cut short.
printf 'info d1\nremove\000 d1\n' > "$tmpdir/nul.batch"
fails "^nbdmsetup: $tmpdir/nul.batch:2: NUL byte at offset 6 of the line$" \
    ms batch "$tmpdir/nul.batch"
unchanged nul-batch

# --- Errors in a table file name the file and line, as at server start.
printf '0 8 zero\n8 8 frobnicate\n' > "$tmpdir/bad.table"
fails "^nbdmsetup: $tmpdir/bad.table:2: unknown target type 'frobnicate'$" \
    ms create t1 "$tmpdir/bad.table"
for c in load reload replace; do
    fails "^nbdmsetup: $tmpdir/bad.table:2: unknown target type 'frobnicate'$" \
        ms $c d1 "$tmpdir/bad.table"
done
fails "^nbdmsetup: stdin:2: unknown target type 'frobnicate'$" \
    ms replace d1 < "$tmpdir/bad.table"
: > "$tmpdir/empty.table"
fails "^nbdmsetup: $tmpdir/empty.table: table is empty" \
    ms load d1 "$tmpdir/empty.table"
# A device name with a colon is not taken for a line number.
fails "^nbdmsetup: $tmpdir/bad.table:2: unknown target" \
    ms create "t:1" "$tmpdir/bad.table"
# --table has no file: the command and device name the line.
fails "^nbdmsetup: create t1:2: unknown target type 'frobnicate'$" \
    ms create t1 --table "$(cat "$tmpdir/bad.table")"
# In a batch, the batch line comes first.
echo "replace d1 $tmpdir/bad.table" > "$tmpdir/bad.batch"
fails "^nbdmsetup: $tmpdir/bad.batch:1: $tmpdir/bad.table:2: unknown target" \
    ms batch "$tmpdir/bad.batch"
# Errors that are not about a line keep the device.
fails "^nbdmsetup: replace: no such device: nodev$" \
    ms replace nodev "$tmpdir/bad.table"
unchanged table-errors

# --- Arguments and options a command does not take.
echo "0 8 zero" > "$tmpdir/zero.table"
fails "load: a table file \('extra'\) and --table: give one of them" \
    ms load d1 --table "0 8 zero" extra
for c in load reload replace; do
    fails "$c: a table file \('$tmpdir/zero.table'\) and --table" \
        ms $c d1 "$tmpdir/zero.table" --table "0 8 zero"
done
fails "create: a table file .* and --table" \
    ms create n1 --table "0 8 zero" "$tmpdir/zero.table"
fails "--uuid is an option of create" ms ls --uuid u
# -u UUID stands for NAME: the next word is the table file.
fails "load: a table file \('d1'\) and --table: give one of them" \
    ms load d1 --uuid u --table "0 8 zero"
fails "--table is an option of create, load" ms info d1 --table "0 8 zero"
fails "--table is an option of create, load" ms resume d1 --table "0 8 zero"
fails "resume --noflush: not supported: resume flushes what the live table wrote" \
    ms resume --noflush d1
fails "--noflush is an option of suspend, status, wait" ms clear --noflush d1
fails "--force is an option of remove" ms suspend --force d1
fails "--inactive is an option of table" ms status --inactive d1
fails "--showkeys is an option of table" ms info --showkeys d1
fails "wrong number of arguments" ms replace d1 "$tmpdir/zero.table" extra
fails "wrong number of arguments" ms info d1 d2
fails "wrong number of arguments" ms ls d1
echo "clear --noflush d1" > "$tmpdir/opt.batch"
fails "$tmpdir/opt.batch:1: --noflush is an option of suspend" \
    ms batch "$tmpdir/opt.batch"
unchanged arguments

# --- Device names: UTF-8 without control characters.
fails "not valid UTF-8 at byte 1 \(0xff\)" ms create -n "$(printf 'a\377b')"
fails "not valid UTF-8 at byte 0" ms create -n "$(printf '\300\257x')"   # overlong /
fails "not valid UTF-8 at byte 1" ms create -n "$(printf 'a\355\240\200')"   # surrogate
fails "not valid UTF-8 at byte 2" ms create "$(printf 'ab\303')"   # truncated
fails "control character U\+0085 at byte 1" ms create "$(printf 'a\302\205b')"
fails "control character U\+009B at byte 0" ms rename d1 "$(printf '\302\233x')"
unchanged names
ms create "$(printf 'caf\303\251')" --table "0 8 zero"   # é is fine
ms remove "$(printf 'caf\303\251')"
before=$(snapshot)
# The same names as table files: the server does not start.
mkdir "$tmpdir/namedir"
echo "0 8 zero" > "$tmpdir/namedir/$(printf 'x\302\205').table"
mapper_refuses "control character U\+0085 at byte 1" tables="$tmpdir/namedir"

# --- Lengths past the largest NBD size say what the limit is.
fails "length '9223372036854775807' overflows the largest NBD size: at most 18014398509481983 sectors" \
    ms create g1 --table "0 9223372036854775807 zero"
fails "create g1:2: start 18014398509481983 \+ length 8 overflows the maximum device size: a device ends at sector 18014398509481983 at most" \
    ms create g1 --table "0 18014398509481983 zero
18014398509481983 8 zero"
unchanged lengths
ms create g1 --table "0 18014398509481983 zero"
[ "$(nbdinfo --size "nbd+unix:///g1?socket=$sock")" = 9223372036854775296 ] ||
    die "largest device: wrong size"
ms remove g1
before=$(snapshot)

# --- Stale DIR/.NAME.table.tmp files (a save cut short by a crash; they
# may hold crypt keys) are removed at start, and the log says so; other
# files stay.
stop_server ctl
echo "0 8 crypt aes-xts-plain64 $(printf '%064d' 7) 0 $a 0" \
    > "$tmpdir/tables/.d1.table.tmp"
echo "0 8 zero" > "$tmpdir/tables/.gone.table.tmp"
echo "keep" > "$tmpdir/tables/notes.table.tmp"
mkdir "$tmpdir/tables/.dir.table.tmp"
start_server --stderr "$tmpdir/start.log" ctl -v mapper tables="$tmpdir/tables"
[ ! -e "$tmpdir/tables/.d1.table.tmp" ] || die ".d1.table.tmp not removed"
[ ! -e "$tmpdir/tables/.gone.table.tmp" ] || die ".gone.table.tmp not removed"
[ -e "$tmpdir/tables/notes.table.tmp" ] || die "notes.table.tmp removed"
[ -d "$tmpdir/tables/.dir.table.tmp" ] || die "a directory was removed"
grep -q "tables=$tmpdir/tables: removed .d1.table.tmp, left by a save that did not finish" \
    "$tmpdir/start.log" || die "no log line for .d1.table.tmp: $(grep tables= "$tmpdir/start.log")"
[ "$(ms ls)" = d1 ] || die "devices after start: $(ms ls)"
[ "$(ms table d1)" = "0 2048 linear $a 0" ] || die "d1's table changed"
echo "$0: ok"
