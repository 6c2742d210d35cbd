#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# create/load/reload/replace -r (--readonly), as dmsetup -r: the table is
# served read-only whatever its backends allow.  Writes, zeroes and trims
# fail with EPERM (in the server too, for a client that connected while
# the table was writable) and change no byte; info says READ-ONLY; the
# state is saved in tables=DIR and comes back at a restart; a device
# stacked on a read-only one is read-only, and a read-only table under a
# writable holder is refused.
source "$(dirname "$0")/functions-ms.sh"
requires nbdsh --version
requires nbdinfo --version

a=$(mkfile a.img 1M)
b=$(mkfile b.img 1M)
fill_random "$a" 1048576 7
fill_random "$b" 1048576 8
cp "$a" "$tmpdir/a.orig"
cp "$b" "$tmpdir/b.orig"
dir=$tmpdir/tables
mkdir "$dir"
start_server ctl mapper tables="$dir"
uri () { echo "nbd+unix:///$1?socket=$sock"; }

# create -r: read-only from the start, for every client.
ms create ro -r --table "0 2048 linear $a 0"
ms info ro | grep -qx 'State:             ACTIVE (READ-ONLY)' ||
    die "info ro: $(ms info ro)"
[ "$(ms info -c --noheadings -o attr,readonly ro)" = "L--r:Read-only" ] ||
    die "info -c ro: $(ms info -c --noheadings -o attr,readonly ro)"
ms info --json ro | grep -q '"read_only": true' || die "info --json ro"
nbdinfo --json "$(uri ro)" | grep -q '"is_read_only": true' ||
    die "nbdinfo: ro is not read-only"
head -1 "$dir/ro.table" | grep -qx '# nbdmapper-readonly' ||
    die "ro.table: $(cat "$dir/ro.table")"
ms create rw --table "0 2048 linear $b 0"
ms info rw | grep -qx 'State:             ACTIVE' || die "info rw"
! grep -q 'nbdmapper-readonly' "$dir/rw.table" || die "rw.table read-only"

# replace -r under a connected client: it saw a writable device, so its
# writes reach the server, which refuses them with EPERM.
nbdsh -u "$(uri rw)" -c '
import os, subprocess
assert not h.is_read_only()
subprocess.run([os.environ["NBDMSETUP"], "replace", "-r", "rw", "--table",
                "0 2048 linear '"$b"' 0"], check=True)
for what, op in (("pwrite", lambda: h.pwrite(b"x" * 512, 0)),
                 ("zero", lambda: h.zero(512, 0)),
                 ("trim", lambda: h.trim(512, 0))):
    try:
        op()
        raise AssertionError(what + " on a read-only table succeeded")
    except nbd.Error as e:
        assert e.errno == "EPERM", (what, e)
assert h.pread(512, 0) == open("'"$b"'", "rb").read(512)
' || die "writes to a table replaced read-only"
cmp "$b" "$tmpdir/b.orig" || die "b.img written through a read-only table"

# load -r + resume: the inactive table's flag goes live and is saved.
ms load -r ro --table "0 1024 linear $a 0"
ms resume ro
ms info ro | grep -qx 'State:             ACTIVE (READ-ONLY)' || die "resumed ro"
head -1 "$dir/ro.table" | grep -qx '# nbdmapper-readonly' || die "resumed ro.table"

# A device stacked on a read-only one is read-only; the lower one
# cannot turn read-only under a writable holder.
ms create wr --table "0 2048 linear $a 0"
ms create st --table "0 1024 linear mapper:ro 0"
ms info st | grep -qx 'State:             ACTIVE (READ-ONLY)' || die "st on ro"
ms create st2 --table "0 8 linear mapper:wr 0"
ms table wr > "$tmpdir/wr.before"
fails "device 'st2' writes to mapper:wr .* but the new table of 'wr' is read-only" \
    ms replace -r wr --table "0 2048 linear $a 0"
ms table wr | cmp - "$tmpdir/wr.before" || die "refused replace changed wr"
ms info wr | grep -qx 'State:             ACTIVE' || die "wr turned read-only"
! grep -q 'nbdmapper-readonly' "$dir/wr.table" || die "refused replace saved"

# A message that changes the table (delay's delays) saves it again: still
# read-only.
ms create dl -r --table "0 2048 delay $a 0 0"
ms message dl 0 delay 1
[ "$(ms table dl)" = "0 2048 delay $a 0 1" ] || die "delay message: $(ms table dl)"
head -1 "$dir/dl.table" | grep -qx '# nbdmapper-readonly' ||
    die "a message saved dl without its read-only line: $(cat "$dir/dl.table")"

# A restart from tables=DIR: the same devices read-only or not.
ms info -c --noheadings -o name,attr > "$tmpdir/attr.before"
grep -qx 'ro:L--r' "$tmpdir/attr.before" || die "attrs: $(cat "$tmpdir/attr.before")"
stop_server ctl
start_server ctl mapper tables="$dir"
ms info -c --noheadings -o name,attr | diff -u "$tmpdir/attr.before" - ||
    die "read-only state changed across the restart"
nbdsh -u "$(uri rw)" -c '
assert h.is_read_only()
try:
    h.pwrite(b"x" * 512, 0)
    raise AssertionError("write after the restart succeeded")
except nbd.Error as e:
    assert e.errno == "EPERM", e
' || die "rw writable after the restart"

# replace without -r: writable again, and saved so.
ms replace rw --table "0 2048 linear $b 0"
ms info rw | grep -qx 'State:             ACTIVE' || die "rw after replace"
! grep -q 'nbdmapper-readonly' "$dir/rw.table" || die "rw.table still read-only"
nbdsh -u "$(uri rw)" -c 'h.pwrite(b"y" * 512, 0); h.flush()' ||
    die "write after replace without -r"
cmp -n 512 "$b" <(head -c 512 /dev/zero | tr '\0' y) || die "write lost"
cmp "$a" "$tmpdir/a.orig" || die "a.img written through a read-only table"

# -r belongs to create, load, reload, replace.
fails "--readonly is an option of create, load, reload, replace" \
    ms resume -r ro
echo "$0: ok"
