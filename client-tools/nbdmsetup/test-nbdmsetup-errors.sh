#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Bad input through nbdmsetup: each is refused with a clear message and
# changes nothing (same tables, same list, backing data untouched).
source "$(dirname "$0")/functions-ms.sh"
requires nbdsh --version

a=$(mkfile a.img 1M)
fill_random "$a" 1048576 5
cp "$a" "$tmpdir/a.orig"
mkdir "$tmpdir/tables"
echo "0 2048 linear $a 0" > "$tmpdir/tables/d1.table"
start_server ctl mapper tables="$tmpdir/tables"
ms create e1 --table "0 8 zero"

snapshot () { { ms ls; ms table; ms table --inactive; ms info; ls "$tmpdir/tables"; cat "$tmpdir/tables"/*.table; } 2>&1; }
before=$(snapshot)
unchanged () { [ "$(snapshot)" = "$before" ] || die "state changed after: $*"; }

# Invalid tables: the message names the line; both slots unchanged.
fails 'replace d1:2: .*unknown target type' \
    ms replace d1 --table "0 1024 linear $a 0
1024 1024 frobnicate"
unchanged replace-bad
fails 'load d1:1:' ms load d1 --table "0 4096 linear $a 0"
unchanged load-beyond-backing
fails 'create n1:2:' ms create n1 --table "0 8 zero
16 8 zero"
unchanged create-gap
ms load d1 --table "0 8 zero"
before=$(snapshot)
fails 'load d1:1:' ms load d1 --table "0 8 linear"
unchanged load-bad-keeps-inactive
[ "$(ms table --inactive d1)" = "0 8 zero" ] || die "inactive lost"
ms clear d1
before=$(snapshot)

# Unknown devices.
for c in info table status suspend resume clear remove; do
    fails "no such device: nodev" ms $c nodev
done
fails 'no such device: nodev' ms rename nodev x
fails 'no such device: nodev' ms message nodev 0 x
fails 'no such device: nodev' ms wait nodev --timeout 1
fails 'no such device: nodev' ms replace nodev --table "0 8 zero"
unchanged unknown

# Existing names, invalid names.
fails "device 'd1' already exists" ms create d1 --table "0 8 zero"
fails "device 'e1' already exists" ms rename d1 e1
fails "reserved for the control export" ms create -n control
fails "contains '/'" ms create -n a/b
fails "empty" ms create -n ""
fails "longer than 127" ms create -n "$(printf 'x%.0s' $(seq 200))"
fails "control character" ms create -n "$(printf 'a\tb')"
fails "uuid" ms create -n u1 --uuid "has space"
unchanged names

# Resume of an empty device, message beyond the end, bad numbers.
ms create -n empty1
before=$(snapshot)
fails 'no table to resume' ms resume empty1
fails 'beyond the end' ms message d1 999999 x
fails "sector 'x1' is not a number" ms message d1 x1 y
fails "not a number" ms wait d1 abc --timeout 1
fails "timeout.*not a number" ms wait d1 --timeout -3
unchanged states

# Tool-side errors: no command, unknown command, arguments, no URI,
# missing table file, unreachable server.
fails 'no command' ms
fails "unknown command 'frob'" ms frob
fails 'wrong number of arguments' ms rename d1
fails 'no control export' env -u NBDMSETUP_URI "$NBDMSETUP" ls
fails "$tmpdir/missing.table" ms load d1 "$tmpdir/missing.table"
fails 'nbd\+unix' ms -a "nbd+unix:///control?socket=$tmpdir/nosock" ls

# A request over 16 MiB is refused before it is sent.
head -c $((17 << 20)) /dev/zero | tr '\0' '#' > "$tmpdir/huge.table"
fails 'larger than the 16 MiB maximum' ms load d1 "$tmpdir/huge.table"
unchanged huge

# An empty uuid or name names no device: -u "" matched the first device
# without a uuid (e1, d1 have none), and "" must not stand for "all".
fails '-u: the uuid is empty' ms -u "" remove
fails '-u: the uuid is empty' ms -u "" info
fails '-u: the uuid is empty' ms create u2 -u "" --table "0 8 zero"
for c in info table status deps suspend resume clear remove wipe_table \
         stats clients; do
    fails "$c: the device name is empty" ms $c ""
done
fails 'rename: the device name is empty' ms rename "" x
fails 'rename: the new name is empty' ms rename d1 ""
fails 'load: the device name is empty' ms load "" --table "0 8 zero"
fails 'message: the device name is empty' ms message "" 0 x
fails 'wait: the device name is empty' ms wait "" --timeout 1
fails 'the device name is empty' ms create "" --table "0 8 zero"
unchanged empty-names

# The plugin documents control-key=.
mapper --help 2>&1 | grep -q 'control-key=FILE' || die "--help: no control-key"

# The wrong export: a device.  nbdmsetup reads first and never writes it.
fails 'not an nbdmapper control export' \
    ms -a "nbd+unix:///d1?socket=$sock" ls
cmp "$a" "$tmpdir/a.orig" || die "device written by a misdirected nbdmsetup"
unchanged wrong-export

# Two control clients racing on one device: serialised, every answer
# coherent (each replace either fully happened or failed cleanly).
for i in $(seq 10); do
    ms replace d1 --table "0 2048 linear $a 0" &
    ms replace d1 --table "0 1024 linear $a 0
1024 1024 linear $a 1024" &
    ms table d1 > "$tmpdir/race.$i" &
done
wait
for i in $(seq 10); do
    t=$(cat "$tmpdir/race.$i")
    [ "$t" = "0 2048 linear $a 0" ] || [ "$t" = "0 1024 linear $a 0
1024 1024 linear $a 1024" ] || die "incoherent table during race: $t"
done
ms info d1 | grep -q '^State:             ACTIVE$' || die "d1 not active after race"
cmp "$a" "$tmpdir/a.orig" || die "data changed by the race"
echo "$0: ok"
