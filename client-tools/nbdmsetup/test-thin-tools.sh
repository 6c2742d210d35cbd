#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The thin-provisioning tools and the pool, both ways:
#  - metadata made by thin_restore from XML is served: every block of each
#    volume reads as the data block the XML maps (or zeros), the status
#    counts what the XML has, and a write to a block two volumes share
#    copies it (the other keeps the old data);
#  - a held metadata snapshot (reserve_metadata_snap) is read by
#    thin_dump --metadata-snap while the pool runs, shows the mappings of
#    that moment, and is released;
#  - thin_dump of the stopped pool shows the writes; thin_check is clean;
#  - damaged metadata (random bytes in several blocks) is refused at load
#    or turns the pool read-only with EIO, and the server goes on.
source "$(dirname "$0")/functions-ms.sh"
requires nbdsh --version
requires thin_check -V
requires thin_dump -V
requires thin_restore -V
requires nbdinfo --version

md=$(mkfile md.img 4M)
data=$(mkfile data.img 4M)          # 64 blocks of 64 KiB
# Data block b holds bytes b + 1, b + 1, ...
python3 -c '
import sys
with open(sys.argv[1], "r+b") as f:
    for b in range(64):
        f.write(bytes([b + 1]) * 65536)
' "$data"
cat > "$tmpdir/in.xml" <<'EOF2'
<superblock uuid="" time="3" transaction="7" flags="0" version="2" data_block_size="128" nr_data_blocks="64">
  <device dev_id="1" mapped_blocks="11" transaction="0" creation_time="0" snap_time="2">
    <range_mapping origin_begin="0" data_begin="20" length="10" time="1"/>
    <single_mapping origin_block="50" data_block="3" time="2"/>
  </device>
  <device dev_id="2" mapped_blocks="5" transaction="0" creation_time="2" snap_time="2">
    <range_mapping origin_begin="100" data_begin="20" length="5" time="1"/>
  </device>
</superblock>
EOF2
thin_restore -i "$tmpdir/in.xml" -o "$md" || die "thin_restore"
thin_check "$md" || die "thin_check of the restored metadata"

mkdir "$tmpdir/tables"
start_server --stderr "$tmpdir/log" ctl -f mapper tables="$tmpdir/tables"
ms create pool --table "0 8192 thin-pool $md $data 128 0"
ms create t1 --table "0 16384 thin mapper:pool 1"        # 128 blocks
ms create t2 --table "0 16384 thin mapper:pool 2"
ms status pool | grep -q '^0 8192 thin-pool 7 [0-9]*/1024 11/64 - rw ' ||
    die "pool status: $(ms status pool)"
[ "$(ms status t1)" = "0 16384 thin 1408 6527" ] || die "t1: $(ms status t1)"
[ "$(ms status t2)" = "0 16384 thin 640 13439" ] || die "t2: $(ms status t2)"

check="$tmpdir/check.py"
cat > "$check" <<'EOF2'
import sys, nbd
sock, name = sys.argv[1], sys.argv[2]
maps = dict(eval(sys.argv[3]))           # vblock -> data block (+1 = byte)
h = nbd.NBD()
h.connect_uri("nbd+unix:///%s?socket=%s" % (name, sock))
for v in range(128):
    got = h.pread(65536, v * 65536)
    want = bytes([maps[v] + 1]) * 65536 if v in maps else bytes(65536)
    assert got == want, "%s block %d: %r..., want %r..." % (name, v, got[:4], want[:4])
EOF2
m1="[(v, 20 + v) for v in range(10)] + [(50, 3)]"
m2="[(100 + v, 20 + v) for v in range(5)]"
python3 "$check" "$sock" t1 "$m1" || die "t1 reads"
python3 "$check" "$sock" t2 "$m2" || die "t2 reads"
# Block status: the mapped blocks are data, the rest holes.
nbdinfo --map "nbd+unix:///t1?socket=$sock" > "$tmpdir/map"
cat > "$tmpdir/map.want" <<'EOF2'
         0      655360    0  data
    655360     2621440    3  hole,zero
   3276800       65536    0  data
   3342336     5046272    3  hole,zero
EOF2
diff -u "$tmpdir/map.want" "$tmpdir/map" || die "t1's map"

# The metadata snapshot, held while the pool changes.
ms message pool 0 reserve_metadata_snap
held=$(ms status pool | cut -d' ' -f7)
[ "$held" != - ] || die "no held root: $(ms status pool)"
fails 'reserve_metadata_snap: a metadata snapshot is already held' \
    ms message pool 0 reserve_metadata_snap
# Blocks 20..24 are shared: writing t1's block 2 copies it.
nbdsh -u "nbd+unix:///t1?socket=$sock" -c '
h.pwrite(b"\xee" * 4096, 2 * 65536 + 8192)
h.flush()
'
python3 "$check" "$sock" t2 "$m2" || die "t2 changed by a write to t1"
thin_dump --metadata-snap "$md" > "$tmpdir/snap.xml" || die "thin_dump --metadata-snap"
python3 - "$tmpdir/snap.xml" <<'EOF2' || die "the metadata snapshot"
import sys, xml.etree.ElementTree as ET
r = ET.parse(sys.argv[1]).getroot()
d = {int(x.get("dev_id")): x for x in r.findall("device")}
assert sorted(d) == [1, 2], d
# as reserved: t1's block 2 still maps data block 22
rm = [m for m in d[1] if m.tag == "range_mapping"]
assert any(int(m.get("origin_begin")) == 0 and int(m.get("length")) == 10
           and int(m.get("data_begin")) == 20 for m in rm), ET.tostring(d[1])
EOF2
# A discard passes down only blocks nothing else references: t1's block
# 50 (data block 3) is t1's alone, but the held metadata snapshot still
# maps it: the data device keeps it.
datablock () { python3 -c '
import sys
f = open(sys.argv[1], "rb"); f.seek(int(sys.argv[2]) * 65536)
print(set(f.read(65536)))' "$data" "$1"; }
nbdsh -u "nbd+unix:///t1?socket=$sock" -c 'h.trim(65536, 50 * 65536)'
[ "$(datablock 3)" = "{4}" ] || die "passdown of a block the metadata snapshot maps"
ms message pool 0 release_metadata_snap
[ "$(ms status pool | cut -d' ' -f7)" = - ] || die "held root after release"
# Without it, t1's block 7 (data block 27, which no other volume maps,
# though it was written before t2's snapshot time) is passed down.
nbdsh -u "nbd+unix:///t1?socket=$sock" -c 'h.trim(65536, 7 * 65536)'
[ "$(datablock 27)" = "{0}" ] || die "no passdown of an unshared block: $(datablock 27)"
[ "$(datablock 24)" = "{25}" ] || die "data block 24 changed"
nbdsh -u "nbd+unix:///t1?socket=$sock" -c '
assert h.pread(65536, 7 * 65536) == bytes(65536)
assert h.pread(65536, 50 * 65536) == bytes(65536)
assert h.pread(65536, 6 * 65536) == bytes([27]) * 65536
' || die "t1 after the discards"
ms status pool | grep -q '^0 8192 thin-pool 7 [0-9]*/1024 10/64 ' ||
    die "pool status after the copy and the discards: $(ms status pool)"

# Reloads: a thin device (its new table opens the volume while the old
# one has it open) and the pool (the same pool object: the volumes keep
# working, nothing is lost).
ms reload t2 --table "0 16384 thin mapper:pool 2"
ms resume t2
python3 "$check" "$sock" t2 "$m2" || die "t2 after its reload"
ms reload pool --table "0 8192 thin-pool $md $data 128 5"
ms resume pool
ms table pool | grep -q " 128 5 0$" || die "pool table: $(ms table pool)"
python3 "$check" "$sock" t2 "$m2" || die "t2 after the pool's reload"
fails 'delete: device 2 is open' ms message pool 0 delete 2

ms remove t1
ms remove t2
ms remove pool
stop_server ctl
thin_check "$md" || die "thin_check"
thin_dump "$md" > "$tmpdir/out.xml"
python3 - "$tmpdir/out.xml" <<'EOF2' || { cat "$tmpdir/out.xml"; die "thin_dump after the write"; }
import sys, xml.etree.ElementTree as ET
r = ET.parse(sys.argv[1]).getroot()
assert r.get("transaction") == "7"
maps = {}
for d in r.findall("device"):
    m = {}
    for x in d:
        if x.tag == "single_mapping":
            m[int(x.get("origin_block"))] = int(x.get("data_block"))
        else:
            for i in range(int(x.get("length"))):
                m[int(x.get("origin_begin")) + i] = int(x.get("data_begin")) + i
    maps[int(d.get("dev_id"))] = m
assert maps[2] == {100 + v: 20 + v for v in range(5)}, maps[2]
assert set(maps[1]) == set(range(10)) - {7}, maps[1]
assert maps[1][2] != 22, maps[1]
assert all(maps[1][v] == 20 + v for v in range(10) if v not in (2, 7))
EOF2

# Damaged metadata: random bytes over several blocks.
cp "$md" "$tmpdir/md.good"
python3 - "$md" <<'EOF2'
import os, random, sys
rng = random.Random(14)
with open(sys.argv[1], "r+b") as f:
    for blk in [0] + rng.sample(range(1, 40), 12):
        f.seek(blk * 4096 + rng.randrange(0, 3000))
        f.write(os.urandom(1000))
EOF2
start_server --stderr "$tmpdir/log2" ctl -f mapper tables="$tmpdir/tables"
fails 'thin-pool: metadata device .*md.img: .*(superblock|checksum|block)' \
    ms create pool --table "0 8192 thin-pool $md $data 128 0"
ms create other --table "0 8 zero"
ms ls | grep -q '^other' || die "the server does not go on"
# Interior blocks only (a sound superblock): refused, or read-only on use.
cp "$tmpdir/md.good" "$md"
python3 - "$md" <<'EOF2'
import os, random, sys
rng = random.Random(15)
with open(sys.argv[1], "r+b") as f:
    for blk in rng.sample(range(1, 40), 15):
        f.seek(blk * 4096)
        f.write(os.urandom(4096))
EOF2
if ms create pool --table "0 8192 thin-pool $md $data 128 0" 2> "$tmpdir/err"; then
    ms create t1 --table "0 16384 thin mapper:pool 1" 2> "$tmpdir/err" || :
    if ms info t1 > /dev/null 2>&1; then
        nbdsh -u "nbd+unix:///t1?socket=$sock" -c '
import errno
try:
    for v in range(128):
        h.pread(65536, v * 65536)
    h.pwrite(b"x" * 65536, 60 * 65536)
    h.flush()
except nbd.Error as e:
    assert e.errnum == errno.EIO, e
' || die "damaged metadata: not EIO"
    fi
    ms status pool
else
    cat "$tmpdir/err"
    grep -Eq 'metadata' "$tmpdir/err" || die "unclear refusal: $(cat "$tmpdir/err")"
fi
ms ls | grep -q '^other' || die "the server does not go on"
stop_server ctl
echo "$0: ok"
