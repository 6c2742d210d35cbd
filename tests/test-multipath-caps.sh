#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Paths that differ in what they can do (nbdkit file over one file):
#
#  1. a read-only path beside a writable one is refused, naming it, and
#     nothing is created; paths all read-only make a read-only device;
#  2. FUA where the paths differ in native FUA (nbdkit file, or eval
#     without FUA): path x (group 1) fails every write (the error
#     filter), so a FUA write is retried on y, counted on y's log:
#     a. x native, y not: y gets the write without FUA, then a flush;
#     b. x not, y native: y gets the write with FUA (the clone's FUA is
#        decided for the path it lands on, not the first one).
source "${top_srcdir:-$(dirname "$0")/..}/tests/functions-mpath.sh"

requires nbdkit --version
requires nbdkit --filter=log --filter=error null --version
requires nbdkit eval --version
requires nbdinfo --version
requires python3 -c 'import nbd'

disk=$(mkfile disk.img 4M)
kit a "$disk"
kit r "$disk" --readonly
kit s "$disk" --readonly
A=$(kit_uri a) R=$(kit_uri r) S=$(kit_uri s)

# --- 1. read-only and writable paths ------------------------------------
echo "0 8192 multipath 0 0 1 1 round-robin 0 1 0 $A" > "$tmpdir/m.table"
start_mapper "$tmpdir/m.table"
rc=0
ms create r --table "0 8192 multipath 0 0 1 1 round-robin 0 2 0 $A $R" \
    2> "$tmpdir/err" || rc=$?
cat "$tmpdir/err"
[ "$rc" -eq 1 ] || die "a read-only path beside a writable one: exit $rc"
grep -Eq "path $(re "$R") is read-only, path $(re "$A") is not: every path must reach the same storage, writable alike" \
    "$tmpdir/err" || die "the error does not name the read-only path"
! ms info r 2>/dev/null || die "the refused device exists"
ms create r --table "0 8192 multipath 0 0 1 1 round-robin 0 2 0 $R $S"
nbdinfo --json "nbd+unix:///r?socket=$tmpdir/ctl.sock" |
    grep -q '"is_read_only": true' || die "device r over read-only paths is writable"
stop_server ctl

# --- 2. FUA over paths with and without native FUA ----------------------
# server NAME native|none [--FILTER...] [KEY=VALUE...]: nbdkit over $disk
# on $tmpdir/NAME.sock, with FUA (the file plugin) or without (the eval
# plugin, as nbdkit 1.32's fua filter refuses fuamode=none).
server ()
{
    local n=$1 mode=$2
    shift 2
    if [ "$mode" = native ]; then kit "$n" "$disk" "$@"; return; fi
    local opts=() params=()
    for a in "$@"; do
        case $a in --*) opts+=("$a") ;; *) params+=("$a") ;; esac
    done
    start_server "$n" "${opts[@]}" eval get_size="echo $(stat -c %s "$disk")" \
        pread="dd if='$disk' iflag=skip_bytes,count_bytes skip=\$4 count=\$3 status=none" \
        pwrite="dd of='$disk' oflag=seek_bytes conv=notrunc seek=\$4 status=none" \
        can_write='exit 0' can_flush='exit 0' flush="sync '$disk'" \
        can_fua='echo none' "${params[@]}"
}
# fua_write CASE XFUA YFUA: servers x and y with FUA or not, one FUA
# write of device m; y's log in $tmpdir/y.log.
fua_write ()
{
    rm -f "$tmpdir/y.log"
    server "x$1" "$2" --filter=error error-pwrite=EIO error-pwrite-rate=1
    server "y$1" "$3" --filter=log logfile="$tmpdir/y.log"
    echo "0 8192 multipath 0 0 2 1 round-robin 0 1 0 $(kit_uri "x$1") round-robin 0 1 0 $(kit_uri "y$1")" \
        > "$tmpdir/m.table"
    start_mapper "$tmpdir/m.table"
    timeout 60 python3 - "$dev_uri" <<'PY' || die "case $1: the FUA write failed"
import sys, nbd
h = nbd.NBD()
h.connect_uri(sys.argv[1])
h.pwrite(b"\xa5" * 4096, 65536, nbd.CMD_FLAG_FUA)
PY
    logged "path $(re "$(kit_uri "x$1")") failed \(I/O error\)"
    stop_server ctl
    grep -E ' (Write|Flush) id=' "$tmpdir/y.log"
}
fua_write a native none
grep -E ' (Write|Flush) id=' "$tmpdir/y.log" |
    grep -A1 ' Write id=.* offset=0x10000 .*fua=0' | grep -q ' Flush id=' ||
    die "case a: the write retried on a path without FUA was not followed by a flush"
fua_write b none native
grep -q ' Write id=.* offset=0x10000 .*fua=1' "$tmpdir/y.log" ||
    die "case b: the write retried on a path with FUA lost its FUA"
echo "$0: ok"
