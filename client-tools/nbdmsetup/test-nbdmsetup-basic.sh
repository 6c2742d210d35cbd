#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Every command against a live server: create (with and without a table),
# load/resume, replace, info/table/status/ls/targets in dmsetup formats
# and JSON, rename, remove (busy, --force), wait, message, list_exports.
source "$(dirname "$0")/functions-ms.sh"
requires nbdinfo --version
requires nbdsh --version
requires python3 -c 'import json'

a=$(mkfile a.img 1M)
fill_random "$a" 1048576 3
mkdir "$tmpdir/tables"
echo "0 2048 linear $a 0" > "$tmpdir/tables/d1.table"
start_server ctl mapper tables="$tmpdir/tables"

ms --version | grep -q '^nbdmsetup ' || die "--version"
ms --help | grep -q 'replace NAME' || die "--help"
ms version | grep -q '^Server version: ' || die version
[ "$(ms ls)" = d1 ] || die "ls: $(ms ls)"
ms targets | grep -Eq '^linear +v[0-9]+\.[0-9]+\.[0-9]+$' || die targets

# info in dmsetup's format.
ms info d1 > "$tmpdir/info"
cat "$tmpdir/info"
grep -q '^Name:              d1$' "$tmpdir/info" || die "info Name"
grep -q '^State:             ACTIVE$' "$tmpdir/info" || die "info State"
grep -q '^Tables present:    LIVE$' "$tmpdir/info" || die "info tables"
grep -q '^Open count:        0$' "$tmpdir/info" || die "info open count"
grep -q '^Number of targets: 1$' "$tmpdir/info" || die "info targets"
[ "$(ms table d1)" = "0 2048 linear $a 0" ] || die "table d1: $(ms table d1)"
[ "$(ms status d1)" = "0 2048 linear" ] || die "status d1: $(ms status d1)"

# create without a table: suspended and empty; NBD sees size 0.
ms create -n e1 --uuid UUID-E1
ms info e1 | grep -q '^State:             SUSPENDED$' || die "e1 not suspended"
ms info e1 | grep -q '^Tables present:    None$' || die "e1 has a table"
ms info e1 | grep -q '^UUID: UUID-E1$' || die "e1 uuid"
[ "$(nbdinfo --size "nbd+unix:///e1?socket=$sock")" = 0 ] || die "e1 size"
# load fills INACTIVE only; resume makes it live and bumps the event.
ms load e1 --table "0 100 linear $a 100"
ms info e1 | grep -q '^Tables present:    INACTIVE$' || die "e1 after load"
[ "$(ms table --inactive e1)" = "0 100 linear $a 100" ] || die "inactive"
[ -z "$(ms table e1)" ] || die "e1 has a live table before resume"
ms clear e1
ms info e1 | grep -q '^Tables present:    None$' || die "clear"
echo "0 100 linear $a 100" | ms reload e1
ev=$(ms info --json e1 | python3 -c 'import json,sys; print(json.load(sys.stdin)["devices"][0]["event_nr"])')
ms resume e1
ms info e1 | grep -q '^State:             ACTIVE$' || die "e1 not active"
ms wait e1 "$ev" --timeout 5 || die "wait after resume"
[ "$(nbdinfo --size "nbd+unix:///e1?socket=$sock")" = 51200 ] || die "e1 size"
nbdsh -u "nbd+unix:///e1?socket=$sock" -c '
with open("'"$a"'", "rb") as f:
    f.seek(100 * 512)
    assert h.pread(51200, 0) == f.read(51200)
' || die "e1 data"

# Create with a table from a file and from stdin; the list follows.
echo "0 64 zero" > "$tmpdir/z.table"
ms create z1 "$tmpdir/z.table"
echo "0 32 zero" | ms create z2 -
nbdinfo --list --json "nbd+unix:///?socket=$sock" > "$tmpdir/list.json"
python3 - "$tmpdir/list.json" <<'PY'
import json, sys
names = sorted(e["export-name"] for e in json.load(open(sys.argv[1]))["exports"])
assert names == ["d1", "e1", "z1", "z2"], names
PY

# All devices: "name: line" as dmsetup prints them.
ms table > "$tmpdir/all"
grep -qx "z1: 0 64 zero" "$tmpdir/all" || die "table (all)"
grep -qx "d1: 0 2048 linear $a 0" "$tmpdir/all" || die "table (all) d1"

# JSON for every read command.
for c in ls info table status targets version; do
    ms --json $c | python3 -c 'import json,sys; json.load(sys.stdin)' ||
        die "--json $c is not JSON"
done
ms table --json d1 | python3 -c '
import json, sys
d = json.load(sys.stdin)["devices"]
assert d == [{"name": "d1", "table": ["0 2048 linear '"$a"' 0"]}], d'

# replace: new table live at once, data unchanged.
ms replace d1 --table "0 1000 linear $a 0
1000 1048 linear $a 1000"
ms info d1 | grep -q '^Number of targets: 2$' || die "replace"
cmp <(nbdsh -u "nbd+unix:///d1?socket=$sock" -c 'import sys; sys.stdout.buffer.write(h.pread(1048576, 0))') "$a" ||
    die "data changed across replace"

# message: no target takes one yet.
fails 'does not accept messages' ms message d1 0 hello world

# wait times out without an event.
fails 'timed out' ms wait d1 --timeout 0.1

# rename: the export follows; persisted file follows.
ms rename z2 z3
[ -e "$tmpdir/tables/z3.table" ] && [ ! -e "$tmpdir/tables/z2.table" ] ||
    die "rename not persisted"
[ "$(nbdinfo --size "nbd+unix:///z3?socket=$sock")" = 16384 ] || die "z3"

# remove: refused while a client is connected, --force swaps in error.
nbdsh -u "nbd+unix:///z1?socket=$sock" -c '
import subprocess, os
ms = os.environ["NBDMSETUP"]
r = subprocess.run([ms, "remove", "z1"], capture_output=True, text=True)
assert r.returncode == 1 and "open by 1 connection" in r.stderr, r
info = subprocess.run([ms, "info", "z1"], capture_output=True, text=True).stdout
assert "Open count:        1" in info, info
subprocess.run([ms, "remove", "--force", "z1"], check=True)
try:
    h.pread(512, 0)
    raise AssertionError("read after remove --force succeeded")
except nbd.Error as e:
    assert e.errno == "EIO", e
' || die "remove while open"
fails 'no such device: z1' ms info z1
ms remove z3
[ "$(ms ls)" = "d1
e1" ] || die "ls after remove: $(ms ls)"
[ ! -e "$tmpdir/tables/z3.table" ] || die "remove not persisted"

# A client of a device without a table sees size 0 and no flush (so no
# request can wait forever); remove needs --force while it is connected.
ms create -n hold
nbdsh -u "nbd+unix:///hold?socket=$sock" -c '
import subprocess, os
assert h.get_size() == 0
assert not h.can_flush()
r = subprocess.run([os.environ["NBDMSETUP"], "remove", "hold"],
                   capture_output=True, text=True)
assert r.returncode == 1 and "open by 1 connection" in r.stderr, r
subprocess.run([os.environ["NBDMSETUP"], "remove", "--force", "hold"],
               check=True)
' || die "remove --force of an open device without a table"
fails 'no such device: hold' ms info hold

# status --backends: each backend of the live table once, with its kind.
b=$(mkfile b.img 1M)
ms create bk --table "0 1024 linear $b 0
1024 1024 linear $b 1024
2048 8 zero"
[ "$(ms status --backends bk)" = "file $(realpath "$b"): open" ] ||
    die "status --backends: $(ms status --backends bk)"
ms create -n bk0
ms --json status --backends | /usr/bin/python3 -c '
import json, sys
d = {x["name"]: x["backends"] for x in json.load(sys.stdin)["devices"]}
assert d["bk0"] == [], d
assert [(x["kind"], x["state"]) for x in d["bk"]] == [("file", "open")], d
' || die "status --backends --json"
ms status --backends | grep -qx "bk: file $(realpath "$b"): open" ||
    die "status --backends of all: $(ms status --backends)"
fails 'backends is an option of status' ms table --backends bk
# Checked before connecting, like the arguments.
fails 'backends is an option of status' \
    ms -a "nbd+unix:///control?socket=$tmpdir/nosock" table --backends bk
# A stacked device is a backend of kind device, named as in the table.
ms create st --table "0 8 linear mapper:bk 0
8 8 linear $b 0"
[ "$(ms status --backends st)" = "device mapper:bk: open
file $(realpath "$b"): open" ] ||
    die "status --backends of a stacked device: $(ms status --backends st)"
ms remove st; ms remove bk; ms remove bk0
echo "$0: ok"
