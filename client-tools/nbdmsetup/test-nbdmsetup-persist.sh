#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# tables=DIR: create/replace/resume/rename/remove are saved atomically; a
# restarted server comes back with the same devices and tables; a device
# created without a table comes back suspended and empty; a read-only DIR
# is reported at start.
source "$(dirname "$0")/functions-ms.sh"
requires nbdsh --version

a=$(mkfile a.img 1M)
dir=$tmpdir/tables
mkdir "$dir"
echo "0 2048 linear $a 0" > "$dir/base.table"
start_server ctl mapper tables="$dir"

ms create c1 --table "0 100 linear $a 0"
ms create c2 --table "0 8 zero" --uuid U2
ms create -n empty1
ms replace base --table "0 1000 linear $a 0
1000 1048 linear $a 1000"
ms create l1 --table "0 10 zero"
ms load l1 --table "0 20 zero"
ms resume l1
ms load c1 --table "0 50 zero"   # inactive only: not saved
ms rename c2 c3
ms create gone --table "0 8 zero"
ms remove gone
ls -a "$dir"
[ ! -e "$dir/gone.table" ] || die "removed device still saved"
[ -z "$(ls -a "$dir" | grep '\.tmp$')" ] || die "temporary files left"

ms table > "$tmpdir/before"
ms ls > "$tmpdir/ls.before"
stop_server ctl
start_server ctl mapper tables="$dir"
ms table > "$tmpdir/after"
diff -u "$tmpdir/before" "$tmpdir/after" || die "tables differ after restart"
[ "$(ms ls | sort)" = "$(sort "$tmpdir/ls.before")" ] || die "devices differ"
ms info empty1 | grep -q '^State:             SUSPENDED$' || die "empty1 state"
ms info empty1 | grep -q '^Tables present:    None$' || die "empty1 tables"
[ "$(ms table l1)" = "0 20 zero" ] || die "resumed table not saved"
ms info c3 | grep -q '^UUID: U2$' || die "uuid not saved across rename+restart"
head -1 "$dir/empty1.table" | grep -qx '# nbdmapper-no-table' || die "empty1 file"
[ "$(ms table c1)" = "0 100 linear $a 0" ] || die "inactive table was saved"
stop_server ctl

# A remove changes nothing when its file cannot go (before, the device
# went and its file stayed: the restart brought back a device whose
# remove had failed), nor when the device refuses (held by a stacked
# device): its file is put back.  An immutable DIR makes the file's
# removal fail even for root; skipped where chattr +i does not work.
start_server ctl mapper tables="$dir"
ms create keep --table "0 8 zero"
ms create up --table "0 8 linear mapper:keep 0"
fails "is in use by device 'up'" ms remove keep
[ -f "$dir/keep.table" ] || die "keep.table not put back after a refused remove"
[ -z "$(ls -A "$dir" | grep '\.tmp$')" ] || die "temp file left: $(ls -A "$dir")"
ms remove up
if chattr +i "$dir" 2>/dev/null; then
    fails "tables=.*: removing keep.table: Operation not permitted" \
        ms remove keep
    chattr -i "$dir"
    ms info keep > /dev/null || die "keep gone after a remove that failed"
    [ -f "$dir/keep.table" ] || die "keep.table gone"
    stop_server ctl
    start_server ctl mapper tables="$dir"
    ms info keep > /dev/null || die "keep not there after the restart"
else
    echo "$0: chattr +i not supported here: skipping the immutable DIR case"
fi
ms remove keep
[ ! -e "$dir/keep.table" ] || die "keep.table left after remove"
[ -z "$(ls -A "$dir" | grep '\.tmp$')" ] || die "temp file left: $(ls -A "$dir")"
stop_server ctl

# A device loaded from elsewhere (table=FILE, an earlier tables=DIR)
# is loaded from there again at a restart: a change saved in DIR would
# stand beside it ("already exists") and the server would not start.
# Such changes are refused and change nothing; the devices DIR holds
# change as before, and the server restarts on the same parameters.
mkdir "$tmpdir/other" "$tmpdir/saved"
echo "0 8 zero" > "$tmpdir/outside.table"
echo "0 16 zero" > "$tmpdir/other/early.table"
echo "0 24 zero" > "$tmpdir/saved/inside.table"
set -- "$tmpdir/outside.table" tables="$tmpdir/other" tables="$tmpdir/saved"
start_server ctl mapper "$@"
for d in outside early; do
    fails "tables=$tmpdir/saved holds no $d.table: the device came from table=FILE" \
        ms replace $d --table "0 32 zero"
    ms load $d --table "0 40 zero"           # inactive only: not saved
    fails "holds no $d.table" ms resume $d
    ms clear $d
    fails "holds no $d.table" ms rename $d moved
    fails "holds no $d.table" ms remove $d
done
ms replace inside --table "0 48 zero"
ms create new --table "0 56 zero"
[ "$(ls -A "$tmpdir/saved" | sort | tr '\n' ' ')" = "inside.table new.table " ] ||
    die "tables=DIR holds $(ls -A "$tmpdir/saved")"
ms table | sort > "$tmpdir/before"
stop_server ctl
start_server ctl mapper "$@"
ms table | sort > "$tmpdir/after"
diff -u "$tmpdir/before" "$tmpdir/after" || die "tables differ after restart"
grep -qx 'outside: 0 8 zero' "$tmpdir/after" || die "outside changed"
grep -qx 'early: 0 16 zero' "$tmpdir/after" || die "early changed"
stop_server ctl

# A read-only DIR is refused at start (not at the first change).  Root
# can write anywhere, so the server runs as nobody for this check.
if setpriv --reuid=65534 --regid=65534 --clear-groups true 2>/dev/null; then
    mkdir "$tmpdir/ro"
    echo "0 8 zero" > "$tmpdir/ro/r.table"
    chmod 755 "$tmpdir" "$tmpdir/ro"; chmod 644 "$tmpdir/ro/r.table"
    mapper_refuses --wrap 'setpriv --reuid=65534 --regid=65534 --clear-groups' \
        "tables=$tmpdir/ro: not writable" tables="$tmpdir/ro"
    chmod 700 "$tmpdir"
fi
echo "$0: ok"
