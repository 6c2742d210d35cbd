#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Changes that would break a device stacked on another are refused,
# naming the holder, and leave a tables=DIR that restarts:
# - replace (and load + resume) of the lower device with a table shorter
#   than what the upper one maps, or with a larger minimum block size
#   than its areas are aligned to, or than the upper device's own, or
#   read-only under a writable upper device;
# - remove --force of the lower device, and its rename (before its
#   table file is renamed);
# and an upper table in the inactive slot holds the lower device too.
# A server whose devices stack exits on SIGTERM (unloading freed a
# stacked device's table under the backend registry's lock: deadlock).
source "$(dirname "$0")/functions-ms.sh"
requires nbdsh --version
requires nbdkit --filter=blocksize-policy memory --version

a=$(mkfile a.img 1M)
dir=$tmpdir/t
mkdir "$dir"
start_server ctl mapper tables="$dir"

# stop_must_exit: SIGTERM, and the server must be gone within 10 s
# (stop_server ctl fails the test otherwise).
stop_must_exit ()
{
    stop_server ctl || die "the server did not exit within 10 s of SIGTERM"
}

# --- shrinking the lower device --------------------------------------------
ms create lo --table "0 2048 linear $a 0"
ms create up --table "0 1024 linear mapper:lo 1024"
ms table > "$tmpdir/before"
fails "device 'up' maps mapper:lo up to sector 2048 in its live table, but the new table of 'lo' has only 100 sectors" \
    ms replace lo --table "0 100 linear $a 0"
ms load lo --table "0 2047 linear $a 0"
fails "device 'up' maps mapper:lo up to sector 2048 in its live table, but the new table of 'lo' has only 2047 sectors" \
    ms resume lo
ms info lo | grep -q '^Tables present:    LIVE & INACTIVE$' ||
    die "a refused resume dropped the inactive table"
ms clear lo
# Growing, or keeping the size, is fine.
ms replace lo --table "0 2048 zero"
ms replace lo --table "0 2048 linear $a 0"
diff -u "$tmpdir/before" <(ms table) || die "tables changed"
nbdsh -u "nbd+unix:///up?socket=$sock" -c 'h.pwrite(b"U" * 512, 1023 * 512)'

# --- removing it -----------------------------------------------------------
fails "device 'lo' is in use by device 'up' as mapper:lo" ms remove --force lo
ms info lo >/dev/null || die "a refused remove removed the device"
[ -e "$dir/lo.table" ] || die "a refused remove removed lo.table"
# Nor renamed, and DIR is not touched (a rename there and back: a crash
# in between leaves up's mapper:lo without a lo, and no start).
before=$(stat -c %y "$dir")
fails "device 'lo' is in use by device 'up' as mapper:lo: it cannot be renamed" \
    ms rename lo lo2
[ "$(stat -c %y "$dir")" = "$before" ] ||
    die "a refused rename renamed lo.table (and back)"

# --- an inactive table holds it too ----------------------------------------
ms create other --table "0 8 zero"
ms load other --table "0 2048 linear mapper:lo 0"
ms remove up
fails "in use by device 'other' \\(its inactive table\\) as mapper:lo" \
    ms remove lo
fails "device 'other' maps mapper:lo up to sector 2048 in its inactive table" \
    ms replace lo --table "0 1024 linear $a 0"
ms clear other
ms replace lo --table "0 1024 linear $a 0"
ms info lo | grep -q '^Holders' && die "lo still has holders: $(ms info lo)"

# --- the block size --------------------------------------------------------
# A remote export with 4096-byte blocks: lo over it has a minimum block
# size of 4096, which up's area at sector 1 is not aligned to.
start_server bs --filter=blocksize-policy memory 1M blocksize-minimum=4096
ms create up --table "0 8 linear mapper:lo 1"
fails "device 'up' maps areas of mapper:lo in its live table that are not aligned to the new table's minimum block size \\(4096 bytes\\)" \
    ms replace lo --table "0 2048 linear nbd+unix:///?socket=$tmpdir/bs.sock 0"
ms remove up
# Aligned areas are not enough: up (minimum block size 1, from lo's) would
# pass 512-byte requests on to a lo that takes 4096 and up.
ms create up --table "0 8 linear mapper:lo 0"
fails "device 'up' takes requests of 1 byte and up \(its live table's minimum block size\) and passes them to mapper:lo, but the new table of 'lo' needs 4096" \
    ms replace lo --table "0 2048 linear nbd+unix:///?socket=$tmpdir/bs.sock 0"
ms remove up

# --- read-only -------------------------------------------------------------
# A writable up would pass its writes on to a read-only lo (EPERM, and
# after a restart up would come back read-only).
start_server ro -r memory 1M
ms create up --table "0 8 linear mapper:lo 0"
fails "device 'up' writes to mapper:lo \(its live table is writable\), but the new table of 'lo' is read-only" \
    ms replace lo --table "0 2048 linear nbd+unix:///?socket=$tmpdir/ro.sock 0"
ms remove up

# --- every refusal left a tables=DIR that starts as it was -------------------
ms create up --table "0 1024 linear mapper:lo 0"
ms table > "$tmpdir/before"
stop_must_exit
start_server ctl mapper tables="$dir"
diff -u "$tmpdir/before" <(ms table) || die "tables differ after restart"

# --- shutdown with a stacked device ------------------------------------------
# The reproduction from the issue: A replaced by a table over B.
ms create A --table "0 2048 linear $a 0"
ms create B --table "0 2048 linear $a 0"
ms replace A --table "0 2048 linear mapper:B 0"
stop_must_exit
echo "$0: ok"
