#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# How the control export is served: under nbdkit -r, or behind an nbdkit
# filter that does not pass it through, nbdmsetup says so (and writes
# nothing to a device); behind the filters nbdmsetup(8) lists as safe,
# the commands work.
source "$(dirname "$0")/functions-ms.sh"
requires nbdinfo --version

a=$(mkfile a.img 1M)
fill_random "$a" 1048576 3
cp "$a" "$tmpdir/a.orig"
mkdir "$tmpdir/tables"
echo "0 2048 linear $a 0" > "$tmpdir/tables/d1.table"
ls -lA --time-style=full-iso "$tmpdir/tables" > "$tmpdir/tables.before"

have_filter () { nbdkit --filter="$1" null --version >/dev/null 2>&1; }

# served ARGS...: a server with these nbdkit options in front of the
# tables; stop it with stop_server.
served () { start_server ctl mapper "$@" tables="$tmpdir/tables"; }

# --- nbdkit -r: requests are writes, so say the server is read-only
# (nbdinfo --list still lists the devices).
served -r
ro='the server is read-only \(nbdkit -r, or a filter\): nbdmsetup writes its requests to the control export, so it can neither list nor change devices'
fails "$ro" ms ls
fails "$ro" ms info d1
fails "$ro" ms create x --table "0 8 zero"
fails "$ro" ms batch /dev/null
nbdinfo --list --json "nbd+unix:///?socket=$sock" | grep -q '"export-name": "d1"' ||
    die "nbdinfo --list under -r"
stop_server ctl

# --- Filters that keep writes to themselves: the request comes back.
for f in cow cache; do
    have_filter $f || { echo "$0: no $f filter, skipped"; continue; }
    served --filter=$f
    fails "ls: the control export gave back the request instead of a response: is a filter in front of the plugin .*--filter=cow" \
        ms ls
    # The filter keeps the first request for the next connection too.
    fails "shows a request where its HELLO should be: is a filter in front of the plugin .*--filter=cow" \
        ms create x --table "0 8 zero"
    stop_server ctl
done

# --- Filters that change the size, the bytes, or refuse the writes.
if have_filter truncate; then
    served --filter=truncate truncate=1M
    fails "the control export is 1048576 bytes, not 16777216: is a filter in front of the plugin" ms ls
    stop_server ctl
fi
if have_filter swab; then
    served --filter=swab
    fails "not an nbdmapper control export \(no response magic at offset 0\): is it nbdmapper's export 'control', with no filter in front of the plugin" ms ls
    stop_server ctl
fi
if have_filter protect; then
    served --filter=protect protect=0-1023
    fails "ls: sending the request: .*Operation not permitted: nbdmapper's control export does not fail this: is a filter in front of the plugin" ms ls
    stop_server ctl
fi
# A device export is still told from the control export, and not written.
if have_filter cow; then
    served --filter=cow
    fails "not an nbdmapper control export" ms -a "nbd+unix:///d1?socket=$sock" ls
    stop_server ctl
fi

# Nothing of that changed a table or the data.
cmp "$a" "$tmpdir/a.orig" || die "a device was written"
ls -lA --time-style=full-iso "$tmpdir/tables" | diff "$tmpdir/tables.before" - ||
    die "the tables changed"

# --- The filters nbdmsetup(8) lists as safe in front of the plugin: every
# command works through them.
pod=$top_srcdir/client-tools/nbdmsetup/nbdmsetup.pod
safe=$(sed -n '/^=head2 Safe filters/,/^=head2/p' "$pod" | grep '^ ')
[ -n "$safe" ] || die "no list of safe filters in $pod"
# The parameters a filter needs to start.
params () {
    case $1 in
        log) echo "logfile=$tmpdir/log" ;;
        stats) echo "statsfile=$tmpdir/stats" ;;
        rate) echo "rate=100M" ;;
        pause) echo "pause-control=$tmpdir/pause.sock" ;;
        ip) echo "allow=all" ;;
        exitwhen) echo "exit-when-file-created=$tmpdir/never" ;;
        delay) echo "delay-read=1ms" ;;
        error) echo "error-rate=0" ;;
        extentlist) echo 0 2048 allocated > "$tmpdir/extents"
                    echo "extentlist=$tmpdir/extents" ;;
    esac
}
n=0
for f in $safe; do
    have_filter "$f" || { echo "$0: no $f filter, skipped"; continue; }
    # shellcheck disable=SC2046
    served --filter="$f" $(params "$f")
    { ms ls | grep -qx d1 &&
      ms create x --table "0 1024 linear $a 0" &&
      [ "$(ms table x)" = "0 1024 linear $a 0" ] &&
      ms replace x --table "0 2048 linear $a 0" &&
      ms suspend x && ms resume x &&
      [ "$(ms table x)" = "0 2048 linear $a 0" ] &&
      ms rename x y && ms remove y &&
      [ "$(ms ls)" = d1 ]; } || die "a command failed behind --filter=$f"
    stop_server ctl
    n=$((n + 1))
done
echo "$0: $n filters checked"
cmp "$a" "$tmpdir/a.orig" || die "a device was written"
echo "$0: ok"
