#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdmsetup stats: exact counts from real clients (nbdsh, fio, nbdcopy)
# per device and per target region, the dmstats report columns, --json,
# --prometheus (checked by a parser of the text format, and promtool
# where installed), --region, --clear, the counts a reload keeps, and
# the bad input: unknown device, bad region, options of other commands.
source "$(dirname "$0")/functions-ms.sh"
requires nbdsh --version
requires fio --version
requires nbdcopy --version
requires python3 -c 'import json'
fio --enghelp 2>/dev/null | grep -qw nbd || { echo "fio has no nbd engine"; exit 77; }

a=$(mkfile a.img 8M)
mkdir "$tmpdir/tables"
# Two targets of 4 MiB.
printf '0 8192 linear %s 0\n8192 8192 linear %s 8192\n' "$a" "$a" \
       > "$tmpdir/tables/d1.table"
start_server ctl mapper tables="$tmpdir/tables"
uri="nbd+unix:///d1?socket=$sock"

# st FIELD [REGION] [DEVICE]: one counter of stats --json.
st ()
{
    ms stats --json "${3:-d1}" | python3 -c '
import json, sys
d = json.load(sys.stdin)["devices"][0]
print(d["regions"][int(sys.argv[2])][sys.argv[1]])' "$1" "${2:-0}"
}
# expect FIELD REGION VALUE
expect ()
{
    local v
    v=$(st "$1" "$2")
    [ "$v" = "$3" ] || die "region $2 $1: $v, expected $3"
}

# Nothing yet; three regions: the device, then each target.
for r in 0 1 2; do
    for f in reads writes discards flushes in_progress read_sectors; do
        expect "$f" "$r" 0
    done
done
ms stats d1 > "$tmpdir/report"
cat "$tmpdir/report"
head -1 "$tmpdir/report" | grep -Eq '^Name +RgID +ArID +ArStart +ArSize +RMrg/s +WMrg/s +R/s +W/s +RSz/s +WSz/s +AvgRqSz +QSize +Util% +AWait +RdAWait +WrAWait$' ||
    die "report header"
[ "$(wc -l < "$tmpdir/report")" = 4 ] || die "report: 3 regions"
grep -Eq '^d1 +2 +0 +4\.00m +4\.00m ' "$tmpdir/report" || die "region 2 start/size"

# 10 reads of 4K in the first target; a write of 8K across the boundary
# (4K each side); a trim of 64K and a write zeroes of 4K in the second; a
# flush.
nbdsh -u "$uri" -c '
for i in range(10):
    h.pread(4096, i * 4096)
h.pwrite(b"x" * 8192, 4 * 1024 * 1024 - 4096)
h.trim(65536, 5 * 1024 * 1024)
h.zero(4096, 6 * 1024 * 1024)
h.flush()
'
expect reads 0 10
expect read_sectors 0 80
expect read_bytes 0 40960
expect reads_merged 0 0
expect reads 1 10
expect read_sectors 1 80
expect reads 2 0
expect writes 0 2
expect write_sectors 0 24
expect writes 1 1
expect write_sectors 1 8
expect writes 2 2
expect write_sectors 2 16
expect discards 0 1
expect discard_sectors 0 128
expect discards 1 0
expect discards 2 1
expect flushes 0 1
expect flushes 1 0
for r in 0 1 2; do expect in_progress "$r" 0; done

# The histograms: each operation's buckets sum to its count; the device
# region has them, the target regions do not.
ms stats --json d1 | python3 -c '
import json, sys
regions = json.load(sys.stdin)["devices"][0]["regions"]
h = regions[0]["histograms"]
assert len(h["bounds_ns"]) == 12 and h["bounds_ns"] == sorted(h["bounds_ns"]), h
for op, key in (("read", "reads"), ("write", "writes"),
                ("discard", "discards"), ("flush", "flushes")):
    assert len(h[op]) == 13, (op, h[op])
    assert sum(h[op]) == regions[0][key], (op, h[op], regions[0][key])
assert "histograms" not in regions[1]
assert regions[0]["queue_ns"] == sum(regions[0][k] for k in
    ("read_ns", "write_ns", "discard_ns", "flush_ns"))
assert regions[0]["io_ns"] <= regions[0]["interval_ns"]
' || die "histograms"

# --region: that region alone.
ms stats d1 --region 2 --json | python3 -c '
import json, sys
r = json.load(sys.stdin)["devices"][0]["regions"]
assert [x["region_id"] for x in r] == [2], r
assert r[0]["discards"] == 1 and r[0]["target"] == "linear", r
' || die "--region 2"

# --prometheus: the text exposition format.
ms stats --prometheus d1 > "$tmpdir/prom"
python3 - "$tmpdir/prom" <<'PYEOF' || die "--prometheus"
# A parser of the text exposition format (0.0.4): every sample's family
# has one HELP and one TYPE line before its samples, families are not
# interleaved, counters end in _total, histogram buckets are cumulative,
# end with le="+Inf" equal to _count, and _sum is there.
import re, sys
name_re = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
label_re = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*"'
sample_re = re.compile(r"^(%s)(\{(%s)(,%s)*\})? (\S+)$" % (name_re, label_re, label_re))
types, helps, seen_done, current = {}, set(), set(), None
samples = []
for line in open(sys.argv[1]).read().splitlines():
    if line.startswith("# HELP "):
        name = line.split()[2]
        assert name not in helps, "second HELP " + name
        helps.add(name)
        continue
    if line.startswith("# TYPE "):
        _, _, name, typ = line.split()
        assert name in helps and name not in types, line
        assert typ in ("counter", "gauge", "histogram"), line
        types[name] = typ
        if current:
            seen_done.add(current)
        current = name
        continue
    m = sample_re.match(line)
    assert m, "bad line: " + line
    name, value = m.group(1), float(m.group(5))
    fam = name
    if types.get(current) == "histogram":
        fam = re.sub(r"_(bucket|sum|count)$", "", name)
    assert fam == current and fam not in seen_done, "family out of place: " + line
    if types[fam] == "counter":
        assert name.endswith("_total"), name
    labels = dict(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
    samples.append((name, labels, value))
def get(name, **kw):
    v = [s[2] for s in samples if s[0] == name and all(s[1].get(k) == x for k, x in kw.items())]
    assert len(v) == 1, (name, kw, v)
    return v[0]
assert get("nbdmapper_reads_total", device="d1", region="0") == 10
assert get("nbdmapper_read_bytes_total", device="d1", region="1") == 40960
assert get("nbdmapper_writes_total", device="d1", region="2") == 2
assert get("nbdmapper_flushes_total", device="d1", region="0") == 1
assert get("nbdmapper_in_progress", device="d1", region="0") == 0
for op, n in (("read", 10), ("write", 2), ("discard", 1), ("flush", 1)):
    buckets = [(s[1]["le"], s[2]) for s in samples
               if s[0] == "nbdmapper_request_duration_seconds_bucket" and s[1]["op"] == op]
    assert buckets[-1][0] == "+Inf", buckets
    les = [float(le) for le, _ in buckets[:-1]]
    assert les == sorted(les), les
    counts = [c for _, c in buckets]
    assert counts == sorted(counts), counts
    assert counts[-1] == n == get("nbdmapper_request_duration_seconds_count", op=op)
    get("nbdmapper_request_duration_seconds_sum", op=op)
print("prometheus: %d samples, %d families" % (len(samples), len(types)))
PYEOF
if command -v promtool > /dev/null; then
    promtool check metrics < "$tmpdir/prom" || die "promtool check metrics"
fi

# fio: 256 writes of 4K; nbdcopy: 8 reads of 1M.
ms stats --clear d1 > /dev/null
expect writes 0 0
fio --name=w --ioengine=nbd --uri="$uri" --rw=write --bs=4k --size=1M \
    --iodepth=4 --output=/dev/null
expect writes 0 256
expect write_sectors 0 2048
expect writes 1 256
expect writes 2 0
ms stats --clear d1 > /dev/null
nbdcopy --no-extents --request-size=1048576 "$uri" "$tmpdir/copy.img"
expect reads 0 8
expect read_sectors 0 16384
expect reads 1 4
expect reads 2 4
expect writes 0 0

# --clear prints the counts it clears (print --clear, dmstats).
[ "$(ms stats --clear --json d1 | python3 -c '
import json, sys; print(json.load(sys.stdin)["devices"][0]["regions"][0]["reads"])')" = 8 ] ||
    die "--clear prints what it clears"
expect reads 0 0
# --clear of one region clears that one only.
nbdsh -u "$uri" -c 'h.pread(4096, 0); h.pread(4096, 5 * 1024 * 1024)'
ms stats --clear --region 2 d1 > /dev/null
expect reads 2 0
expect reads 1 1
expect reads 0 2

# A reload: the first target is kept (its counts too), the second is
# split in two (new regions, from 0); the device region keeps its counts.
ms replace d1 --table "0 8192 linear $a 0
8192 4096 linear $a 8192
12288 4096 linear $a 12288"
expect reads 0 2
expect reads 1 1
expect reads 2 0
expect start 3 12288
ms replace d1 --table "0 8192 linear $a 0
8192 8192 linear $a 8192"

# Bad input: a clear error, exit 1, and nothing changed.
fails 'stats: no such device: nope' ms stats nope
fails 'stats: no such device: nope' ms stats --clear nope
expect reads 0 2
fails "stats: device 'd1' has no region 3: regions are 0 \(the device\) to 2 \(its targets\)" \
      ms stats --clear --region 3 d1
expect reads 0 2
expect reads 1 1
fails "stats: --region 'x' is not a region number" ms stats --region x d1
fails "stats: --region '-1' is not a region number" ms stats --region -1 d1
fails 'stats: --region needs a device name' ms stats --region 1
fails 'stats: --json or --prometheus, not both' ms stats --json --prometheus d1
fails '--clear is an option of stats' ms ls --clear
fails '--prometheus is an option of stats' ms info --prometheus d1
fails '--region is an option of stats' ms table --region 1 d1
fails 'stats: wrong number of arguments' ms stats d1 d2
ms create empty --notable
fails "stats: device 'empty' has no live table" ms stats empty
# Every device: the one without a table has nothing to show.
ms stats --json | python3 -c '
import json, sys
d = json.load(sys.stdin)["devices"]
assert [x["name"] for x in d] == ["d1"], d
' || die "stats of every device"
# In a batch, as on the command line.
printf 'stats --json d1\nstats --region 9 d1\n' > "$tmpdir/batch"
fails 'batch:2: stats: device .d1. has no region 9' ms batch "$tmpdir/batch"

# What nbdmsetup does not send, the server refuses too.
PYTHONPATH="$top_srcdir/client-tools/nbdmsetup${PYTHONPATH:+:$PYTHONPATH}" \
python3 - "$NBDMSETUP_URI" <<'PYEOF' || die "stats at the wire level"
import sys
from ctlproto import Conn
c = Conn(sys.argv[1])
seq = iter(range(1, 100))
def refused(want, args, pat, flags=0):
    st, text = c.call("stats", *args, seq=next(seq), flags=flags)
    assert st == want and pat in text.decode(), (args, st, text)
    print("refused:", st, text.decode())
refused(1, ["d1", "x"], "stats: region 'x' is not a number")
refused(1, ["d1", "1x"], "stats: region '1x' is not a number")
refused(1, ["d1", "99999999999999999999999"], "is not a number")
refused(1, ["", "1"], "stats: a region needs a device")
refused(1, ["d1", "1", "2"], "takes 0 to 2 arguments")
refused(2, ["nope"], "stats: no such device: nope", flags=0x20)
refused(1, ["d1", "5"], "has no region 5", flags=0x20)
st, text = c.call("clients", "a", "b", seq=next(seq))
assert st == 1 and b"takes 0 to 1 arguments" in text, text
PYEOF
expect reads 0 2

# Stacking: a read of a device stacked on d1 (mapper:d1) counts in both.
ms create top --table "0 16384 linear mapper:d1 0"
ms stats --clear d1 > /dev/null
nbdsh -u "nbd+unix:///top?socket=$sock" -c '
for i in range(3):
    h.pread(4096, 8 * 1024 * 1024 - 4096 * (i + 1))
'
expect reads 0 3
expect reads 2 3
[ "$(st reads 0 top)" = 3 ] || die "top: reads $(st reads 0 top)"
[ "$(st target 1 top)" = linear ] || die "top's target region"

# Statistics off (-D mapper.stats_off=1, for benchmarks): said so.
start_server off mapper -D mapper.stats_off=1 "$tmpdir/tables/d1.table"
NBDMSETUP_URI="nbd+unix:///control?socket=$tmpdir/off.sock" \
    fails "stats: device 'd1': statistics are off" ms stats d1
echo "stats: ok"
