#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# tables=DIR when the filesystem fails, and crypt keys in the control
# path, with persist-shim.so preloaded into nbdkit (see the file): each
# command reports what is true of DIR afterwards, with the real error,
# and no buffer of the plugin's that held a key is freed unwiped.
source "$(dirname "$0")/functions-ms.sh"
requires python3 -c 'import nbd'
shim=$top_builddir/client-tools/nbdmsetup/.libs/persist-shim.so
requires test -f "$shim"
# The shim replaces free: it cannot run beside the ASan runtime.
if [ "${#plugin_env[@]}" -gt 0 ]; then
    echo "$0: skipped: persist-shim.so replaces free, which the sanitizer runtime owns"
    exit 77
fi
dir=$tmpdir/tables
mkdir "$dir"
a=$(mkfile a.img 1M)

# st CMD ARGS...: the status of one raw control request.
st ()
{
    PYTHONPATH="$top_srcdir/client-tools/nbdmsetup:$PYTHONPATH" \
    python3 - "$NBDMSETUP_URI" "$@" <<'PY'
import sys
from ctlproto import Conn
c = Conn(sys.argv[1])
s, text = c.call(sys.argv[2], *sys.argv[3:], seq=1)
print(s, text.decode().strip())
PY
}

# A remove or rename whose file cannot move says why, with that error's
# status: EISDIR is "invalid argument" (1), not the I/O error (8) it was.
start_server ctl mapper tables="$dir"
ms create keep --table "0 8 zero"
mkdir -p "$dir/.keep.table.tmp/x" "$dir/new.table/x"
out=$(st remove keep)
echo "remove: $out"
[[ $out == "1 tables=$dir: removing keep.table: Is a directory" ]] ||
    die "remove: $out"
out=$(st rename keep new)
echo "rename: $out"
[[ $out == "1 tables=$dir: renaming keep.table: Is a directory" ]] ||
    die "rename: $out"
ms info keep > /dev/null || die "keep gone"
[ "$(cat "$dir/keep.table")" = "0 8 zero" ] || die "keep.table changed"
rm -r "$dir/.keep.table.tmp" "$dir/new.table"

# A message whose table cannot be looked for in DIR (a symlink loop:
# ELOOP) says the change is live but not saved; it used to save over
# it as if the file were fine, where every other command refuses.
ms create slow --table "0 8 delay $a 0 0"
mv "$dir/slow.table" "$tmpdir/slow.orig"
ln -s slow.table "$dir/slow.table"
fails 'message slow: the change is live but was not saved: tables=.*: looking for slow.table: Too many levels of symbolic links' \
    ms message slow 0 delay 5
[ -L "$dir/slow.table" ] || die "slow.table replaced after a failed check"
rm "$dir/slow.table"
mv "$tmpdir/slow.orig" "$dir/slow.table"
stop_server ctl

# A directory fsync that fails after the rename: the new file is in
# place, and a restart loads it, so the command did what it said; the
# server logs that it may not survive a crash.  It reported the create
# as failed (and dropped the device) although the restart brought it
# back; a rename reported failure with the file renamed and the device
# not.
start_server --stderr "$tmpdir/log" --wrap "env LD_PRELOAD=$shim SHIM_FAIL_DIR_FSYNC=1" \
    ctl -f mapper tables="$dir"
ms create made --table "0 8 zero"
ms rename made renamed
ms replace renamed --table "0 16 zero"
grep -q "tables=$dir: fsync: Input/output error: renamed.table is in place" "$tmpdir/log" ||
    die "no fsync error logged: $(cat "$tmpdir/log")"
ms table | sort > "$tmpdir/before"
stop_server ctl
start_server ctl mapper tables="$dir"
ms table | sort > "$tmpdir/after"
diff -u "$tmpdir/before" "$tmpdir/after" || die "a restart serves other devices"
grep -qx 'renamed: 0 16 zero' "$tmpdir/after" || die "renamed not as replaced"
ms remove renamed
ms remove slow
ms remove keep
stop_server ctl

# Keys: create, table --showkeys, replace, load + resume, key wipe/set,
# remove and a restart that reads a crypt table back: no block holding
# the key is freed by the plugin without being wiped first, nor by libc
# for it (SHIM_SECRET_LIBC: open_memstream's and asprintf's growth).  A
# table of 200 crypt lines (40K), so that the reply to table --showkeys
# and the saved file outgrow stdio's first buffers.
key=$(od -An -N64 -tx1 /dev/urandom | tr -d ' \n')
t="0 2048 crypt aes-xts-plain64 $key 0 $a 0"
for i in $(seq 0 199); do
    echo "$((i * 8)) 8 crypt aes-xts-plain64 $key 0 $a $((i * 8))"
done > "$tmpdir/big.table"
shim_env="LD_PRELOAD=$shim SHIM_SECRET=$key SHIM_SECRET_LIBC=1 SHIM_LOG=$tmpdir/shim.log"
start_server --wrap "env $shim_env" ctl mapper tables="$dir"
ms create c --table "$t"
ms table --showkeys c | grep -q "$key" || die "table --showkeys: no key"
ms create big "$tmpdir/big.table"
[ "$(ms table --showkeys big | grep -c "$key")" = 200 ] ||
    die "table --showkeys big: not 200 keys"
ms remove big
ms replace c --table "0 1024 crypt aes-xts-plain64 $key 0 $a 0"
ms load c --table "$t"
ms resume c
ms suspend c
ms message c 0 key wipe
ms message c 0 key set "$key"
ms resume c
stop_server ctl
start_server --wrap "env $shim_env" ctl mapper tables="$dir"
ms table --showkeys c | grep -q "$key" || die "restart: no key"
ms remove c
stop_server ctl
if [ -s "$tmpdir/shim.log" ]; then
    sort "$tmpdir/shim.log" | uniq -c
    die "memory holding a crypt key was freed without being wiped"
fi
echo "$0: ok"
