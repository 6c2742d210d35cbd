#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# dmsetup's command line, as an LVM user types it: -c/-o/-O/--noheadings
# /--separator/--nameprefixes (info -c with dmsetup's field names), -u
# UUID for NAME, deps, ls --tree and --target, table/status --target,
# remove_all (holders first), wipe_table, target-version, create from
# standard input and -n, -v, -y, -- and the connection under -a; and
# every refusal as one line, exit 1, nothing changed: bad options,
# dmsetup's options and verbs that cannot apply, bad fields.
source "$(dirname "$0")/functions-ms.sh"
requires nbdsh --version
requires python3 -c 'import json'

a=$(mkfile a.img 1M)
b=$(mkfile b.img 1M)
mkdir "$tmpdir/tables"
start_server ctl mapper tables="$tmpdir/tables"

# exactly MSG CMD...: CMD exits 1, its stderr is the one line MSG and its
# stdout is empty.
exactly ()
{
    local msg=$1 rc=0
    shift
    "$@" > "$tmpdir/ex.out" 2> "$tmpdir/ex.err" || rc=$?
    [ "$rc" -eq 1 ] || die "$*: exit $rc, expected 1: $(cat "$tmpdir/ex.err")"
    [ "$(cat "$tmpdir/ex.err")" = "$msg" ] ||
        die "$*: stderr
$(cat "$tmpdir/ex.err")
expected
$msg"
    [ ! -s "$tmpdir/ex.out" ] || die "$*: wrote to stdout: $(cat "$tmpdir/ex.out")"
}

# --- The connection: -a, --connect, $NBDMSETUP_URI; --json long only.
ctl=$NBDMSETUP_URI
ms create d1 --table "0 2048 linear $a 0"
[ "$(env -u NBDMSETUP_URI "$NBDMSETUP" -a "$ctl" ls)" = d1 ] || die "-a URI"
[ "$(env -u NBDMSETUP_URI "$NBDMSETUP" --connect "$ctl" ls)" = d1 ] ||
    die "--connect URI"
exactly "nbdmsetup: no control export: use --connect URI (-a URI) or \$NBDMSETUP_URI" \
    env -u NBDMSETUP_URI "$NBDMSETUP" ls
ms --json ls | python3 -c 'import json, sys; json.load(sys.stdin)' || die "--json"
ms --help | grep -q '^  -a, --connect URI' || die "--help: no -a"
# The old spelling says what the new one is.
exactly "nbdmsetup: unknown command '$ctl': the control export is -a URI (--connect); -c is --columns, as in dmsetup" \
    ms -c "$ctl" ls

# --- info -c: dmsetup's columns and field names.
ms create st -u ST-UUID --table "0 1024 linear mapper:d1 0
1024 1024 linear $b 0"
ms create top --uuid TOP --table "0 2048 linear mapper:st 0"
ms create -n empty
# As libdm aligns: each column to its width (the last too), headings and
# strings to the left, numbers to the right.
pad () { printf '%-32s' "$1"; }
[ "$(ms info -c)" = "Name             Stat Open Targ Event  $(pad UUID)
d1               L--w    0    1      1 $(pad '')
empty            --sw    0    0      0 $(pad '')
st               L--w    0    2      1 $(pad ST-UUID)
top              L--w    0    1      1 $(pad TOP)" ] || die "info -c:
$(ms info -c | cat -A)"
[ "$(ms info -C st)" = "$(ms info --columns st)" ] || die "-C, --columns"
[ "$(ms info -c --noheadings --separator , -o name,segments,devs_used,blkdevs_used,names_using_dev,device_ref_count,device_count)" = "d1,1,,$a,st,1,1
empty,0,,,,0,0
st,2,d1,$b,top,1,2
top,1,st,,,0,1" ] || die "info -c -o deps fields:
$(ms info -c --noheadings --separator , -o name,segments,devs_used,blkdevs_used,names_using_dev,device_ref_count,device_count)"
[ "$(ms info -c -o name,tables_loaded,suspended,readonly -O -name)" = "Name             Tables Suspended Read-only
top              Live   Active    Writeable
st               Live   Active    Writeable
empty            None   Suspended Writeable
d1               Live   Active    Writeable" ] ||
    die "info -c -O -name: $(ms info -c -o name,tables_loaded,suspended,readonly -O -name)"
# --noheadings alone: ':' between the values, not aligned, as dmsetup.
[ "$(ms info -c --noheadings -o name,open,attr st)" = "st:0:L--w" ] ||
    die "--noheadings: $(ms info -c --noheadings -o name,open,attr st)"
[ "$(ms info -c -o +open --noheadings --separator ' ' -O segments,name | head -3)" = "empty --sw 0 0 0  0
d1 L--w 0 1 1  0
top L--w 0 1 1 TOP 0" ] || die "-o +FIELD, -O: $(ms info -c -o +open --noheadings --separator ' ' -O segments,name)"
[ "$(ms info -c --nameprefixes --noheadings -o name,uuid st)" = "DM_NAME='st' DM_UUID='ST-UUID'" ] ||
    die "--nameprefixes: $(ms info -c --nameprefixes --noheadings -o name,uuid st)"
ms info -c -o help | grep -q '^  devs_used ' || die "info -c -o help"
ms help -c | grep -q '^  names_using_dev ' || die "help -c"
exactly "nbdmsetup: -o: field 'major': nbdmapper devices have no device numbers (they are NBD exports)" \
    ms info -c -o name,major
exactly "nbdmsetup: -o: field 'read_ahead': read-ahead is the NBD client's" \
    ms info -c -o read_ahead
exactly "nbdmsetup: -o: unknown field 'bogus' (see info -c -o help)" \
    ms info -c -o name,bogus
exactly "nbdmsetup: -O: unknown field 'nope' (see info -c -o help)" \
    ms info -c -O nope
exactly "nbdmsetup: -o: empty field name in 'name,'" ms info -c -o name,
exactly "nbdmsetup: info: -o, -O, --noheadings, --separator and --nameprefixes go with -c (columns)" \
    ms info --noheadings d1
exactly "nbdmsetup: info -c: --json gives every field already: give one of them" \
    ms info -c --json

# --- -u UUID stands for NAME.
ms info -u ST-UUID | grep -qx 'Name:              st' || die "info -u"
[ "$(ms table -u TOP)" = "0 2048 linear mapper:st 0" ] || die "table -u"
[ "$(ms --uuid TOP deps)" = "1 dependencies	: (mapper:st)" ] || die "deps --uuid"
ms suspend -u TOP
ms info top | grep -qx 'State:             SUSPENDED' || die "suspend -u"
ms load -u TOP --table "0 2048 linear mapper:st 0"
ms info top | grep -qx 'Tables present:    LIVE & INACTIVE' || die "load -u"
ms clear -u TOP
ms resume -u TOP
ms info top | grep -qx 'State:             ACTIVE' || die "resume -u"
ms rename -u TOP top2
ms info top2 | grep -qx 'UUID: TOP' || die "rename -u"
ms rename -u TOP top
ev=$(ms info -c --noheadings -o events top | tr -d ' ')
fails '^nbdmsetup: wait: .*timed out' ms wait -u TOP "$ev" --timeout 0.1
ms status -u ST-UUID | grep -q '^1024 1024 linear' || die "status -u"
exactly "nbdmsetup: -u NOPE: no device has this uuid" ms info -u NOPE
exactly "nbdmsetup: info: -u TOP and NAME 'st': give one of them" \
    ms info -u TOP st
exactly "nbdmsetup: --uuid is an option of create and of the commands that take a NAME" \
    ms ls -u TOP

# --- deps: dmsetup's format, naming the backends as the tables do.
[ "$(ms deps st)" = "2 dependencies	: (mapper:d1) ($b)" ] || die "deps st: $(ms deps st)"
[ "$(ms deps)" = "d1: 1 dependencies	: ($a)
st: 2 dependencies	: (mapper:d1) ($b)
top: 1 dependencies	: (mapper:st)
empty: 0 dependencies	:" ] || die "deps: $(ms deps)"
ms deps --json st | python3 -c '
import json, sys
d = json.load(sys.stdin)["devices"]
assert d == [{"name": "st", "deps": [{"backend": "mapper:d1", "kind": "device"},
                                     {"backend": "'"$b"'", "kind": "file"}]}], d
' || die "deps --json"
exactly "nbdmsetup: deps: -o devno: deps names each backend as its table does (devname); nbdmapper backends have no device numbers" \
    ms deps -o devno st

# --- ls --tree: dmsetup's tree, top-level devices first.
expect="top
 └─st
    ├─d1
    │  └─ ($a)
    └─ ($b)
empty"
# UTF-8 lines where the locale's character set is UTF-8, as dmsetup.
[ "$(LC_ALL=C.UTF-8 ms ls --tree)" = "$expect" ] || die "ls --tree:
$(LC_ALL=C.UTF-8 ms ls --tree)"
[ "$(LC_ALL=C ms ls --tree -o utf)" = "$expect" ] || die "ls --tree -o utf"
[ "$(LC_ALL=C ms ls --tree)" = "$(LC_ALL=C.UTF-8 ms ls --tree -o ascii)" ] ||
    die "ls --tree in the C locale: $(LC_ALL=C ms ls --tree)"
[ "$(ms ls --tree -o ascii,rw,open,uuid,active)" = "top [ACTIVE, RW, 0, TOP]
 \`-st [ACTIVE, RW, 0, ST-UUID]
    |-d1 [ACTIVE, RW, 0, ]
    |  \`- ($a)
    \`- ($b)
empty [SUSPENDED, RW, 0, ]" ] || die "ls --tree -o: $(ms ls --tree -o ascii,rw,open,uuid,active)"
exactly "nbdmsetup: ls --tree: -o device: nbdmapper devices have no device numbers or block device names (they are NBD exports)" \
    ms ls --tree -o device
exactly "nbdmsetup: ls --tree: -o compact: not an option here (ascii, utf, active, open, rw, uuid, notrunc)" \
    ms ls --tree -o compact
exactly "nbdmsetup: ls: -o goes with --tree" ms ls -o ascii

# --- --target on ls, table, status.
ms create z --table "0 8 zero
8 8 linear $b 0"
[ "$(ms ls --target zero)" = z ] || die "ls --target zero: $(ms ls --target zero)"
[ "$(ms ls --target linear | tr '\n' ' ')" = "d1 st top z " ] ||
    die "ls --target linear: $(ms ls --target linear)"
[ "$(ms ls --target striped)" = "No devices found" ] || die "ls --target striped"
[ "$(ms table --target zero)" = "z: 0 8 zero" ] || die "table --target"
[ "$(ms table --target linear z)" = "8 8 linear $b 0" ] || die "table --target z"
[ "$(ms status --target zero z)" = "0 8 zero" ] || die "status --target"
exactly "nbdmsetup: status: --target and --backends: give one of them" \
    ms status --target zero --backends z
exactly "nbdmsetup: --target is an option of ls, table, status" \
    ms info --target zero

# --- create: the table from standard input unless -n, as dmsetup.
echo "0 16 zero" | ms create fromstdin
[ "$(ms table fromstdin)" = "0 16 zero" ] || die "create from stdin"
exactly "nbdmsetup: create: -n (--notable) and a table: give one of them" \
    ms create -n x --table "0 8 zero"
ms create --notable nt
ms info nt | grep -qx 'Tables present:    None' || die "--notable"
[ "$(ms ls | grep -c '^x$')" = 0 ] || die "refused create made x"

# --- -- ends the options: a device named -d.
ms create -n -- -d
ms info -- -d | grep -qx 'Name:              -d' || die "info -- -d"
ms remove -- -d
exactly "nbdmsetup: -d: unknown option (see nbdmsetup --help)" ms info -d

# --- -v, -y, and dmsetup's options that do nothing here.
ms -v table z > "$tmpdir/v.out"
head -1 "$tmpdir/v.out" | grep -qx 'Name:              z' || die "-v table: $(cat "$tmpdir/v.out")"
tail -2 "$tmpdir/v.out" | head -1 | grep -qx '0 8 zero' || die "-v table lines"
ms -v deps z | tail -1 | grep -qx "1 dependencies	: ($b)" || die "-v deps"
ev=$(ms info -c --noheadings -o events z | tr -d ' ')
ms replace z --table "0 8 zero
8 8 linear $b 0"
ms -v wait z "$ev" --timeout 5 > "$tmpdir/v.out"
grep -qx 'Name:              z' "$tmpdir/v.out" && grep -qx "Event number:      $((ev + 1))" "$tmpdir/v.out" ||
    die "-v wait: $(cat "$tmpdir/v.out")"
ms -y remove nt
ms suspend --nolockfs --noudevsync z
ms resume --addnodeonresume z
ms status --noflush z > /dev/null
ms remove --retry fromstdin

# --- Bad options: one line, "see --help", exit 1, no usage.
exactly "nbdmsetup: '--frob': unknown option (see nbdmsetup --help)" ms --frob ls
exactly "nbdmsetup: -x: unknown option (see nbdmsetup --help)" ms ls -x
exactly "nbdmsetup: -x: unknown option (see nbdmsetup --help)" ms ls -fx
exactly "nbdmsetup: -o: missing value (see nbdmsetup --help)" ms info -c -o
exactly "nbdmsetup: '--separator': missing value (see nbdmsetup --help)" \
    ms info -c --separator
exactly "nbdmsetup: --force is an option of remove, remove_all" ms table -f z
exactly "nbdmsetup: --columns is an option of info, help" ms ls -c
# -j and -m are --major and --minor in dmsetup; -U, -G, -M the node's owner.
exactly "nbdmsetup: -j: nbdmapper devices have no device numbers (they are NBD exports): name the device, or -u UUID" \
    ms info -j 253 -m 0
exactly "nbdmsetup: --minor: nbdmapper devices have no device numbers (they are NBD exports): name the device, or -u UUID" \
    ms info --minor 0
for o in -U -G -M; do
    exactly "nbdmsetup: $o: nbdmapper devices have no device node to own: an NBD client (nbd-client, qemu-nbd -c) makes one" \
        ms create $o 0 x --table "0 8 zero"
done
exactly "nbdmsetup: -S: not supported: filter info -c --noheadings --separator S output instead" \
    ms info -c -S 'name=d1'
exactly "nbdmsetup: --readahead: read-ahead is the NBD client's (e.g. blockdev --setra on /dev/nbdN)" \
    ms create x --readahead 256 --table "0 8 zero"
exactly "nbdmsetup: --deferred: not supported: remove --force swaps in an error table at once instead" \
    ms remove --deferred z
[ "$(ms ls | grep -c '^x$')" = 0 ] || die "a refused command made x"

# --- dmsetup's verbs that cannot apply: one line each, why.
for v in mknodes mangle measure splitname setgeometry udevcomplete \
         udevcomplete_all udevcookies udevcreatecookie udevreleasecookie \
         udevflags; do
    "$NBDMSETUP" $v z 1 2 3 4 > "$tmpdir/v.out" 2> "$tmpdir/v.err" &&
        die "$v succeeded"
    [ "$(wc -l < "$tmpdir/v.err")" = 1 ] && [ ! -s "$tmpdir/v.out" ] &&
        grep -q "^nbdmsetup: $v: not for nbdmapper: " "$tmpdir/v.err" ||
        die "$v: $(cat "$tmpdir/v.err")"
done
exactly "nbdmsetup: setgeometry: not for nbdmapper: NBD exports have no C/H/S geometry" \
    ms setgeometry z 1 2 3 4
exactly "nbdmsetup: udevcookies: not for nbdmapper: there is no udev here: devices are NBD exports, made without uevents or cookies" \
    ms udevcookies

# --- target-version, wipe_table.
ms target-version linear zero | grep -Eq '^zero +v[0-9]' || die "target-version"
exactly "nbdmsetup: target-version: unknown target type 'frob' (see targets)" \
    ms target-version frob
ms wipe_table z
[ "$(ms table z)" = "0 16 error" ] || die "wipe_table: $(ms table z)"
nbdsh -u "nbd+unix:///z?socket=$sock" -c '
try:
    h.pread(512, 0)
    raise AssertionError("read after wipe_table succeeded")
except nbd.Error as e:
    assert e.errno == "EIO", e
' || die "wipe_table: reads do not fail"
exactly "nbdmsetup: wipe_table empty: no live table" ms wipe_table empty

# --- remove_all: holders first (top before st before d1); a device with
# a client is refused without -f, naming what went before it.
ms create solo --table "0 8 zero"
nbdsh -u "nbd+unix:///d1?socket=$sock" -c '
import os, subprocess
ms = os.environ["NBDMSETUP"]
r = subprocess.run([ms, "remove_all"], capture_output=True, text=True)
assert r.returncode == 1, r
assert r.stderr == ("nbdmsetup: remove: device \x27d1\x27 is open by 1 connection: "
                    "disconnect them or use --force (removed before it: "
                    "top, empty, z, solo, st)\n"), r.stderr
left = subprocess.run([ms, "ls"], capture_output=True, text=True).stdout
assert left == "d1\n", left
subprocess.run([ms, "remove_all", "--force"], check=True)
' || die "remove_all with a client"
[ "$(ms ls)" = "No devices found" ] || die "remove_all left: $(ms ls)"
[ -z "$(ls "$tmpdir/tables")" ] || die "remove_all left files: $(ls "$tmpdir/tables")"
ms remove_all
echo "$0: ok"
