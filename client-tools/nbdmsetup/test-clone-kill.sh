#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# kill -9 of the server while a clone hydrates (its source read through
# nbdkit's delay filter, so hydration takes a while) and a writer flushes
# often (tests/clone_torture.py): after each restart (tables=DIR) the
# metadata is sound (tests/clone_md.py), every write acknowledged before
# a successful flush is there and no flushed write was overwritten by a
# copy from the source; hydration resumes where the last commit left it
# (the hydrated count never goes back past it) and completes; the
# destination then equals what the device shows.
source "$(dirname "$0")/functions-ms.sh"
requires nbdsh --version
requires nbdkit --filter=delay null --version

src=$(mkfile src.img 8M)
fill_random "$src" $((8 << 20)) 3
md=$(mkfile md.img 4M)
dest=$(mkfile dest.img 8M)
start_server srcsrv -r --filter=delay file "$src" rdelay=4ms
srcuri="nbd+unix:///?socket=$tmpdir/srcsrv.sock"
mkdir "$tmpdir/tables"
start_server --stderr "$tmpdir/log0" ctl -f mapper tables="$tmpdir/tables"
ms create c --table "0 16384 clone $md $dest $srcuri 16 0 2 hydration_threshold 1"
stop_server ctl

torture=$top_srcdir/tests/clone_torture.py
slot=12288 nslots=340     # the first half: the workers alone hydrate the rest
hydrated () { ms status c | awk '{ split($7, a, "/"); print a[1] }'; }
# gen: the highest generation the writer has started to write
gen ()
{
    python3 -c 'import json, sys
try:
    print(max(json.load(open(sys.argv[1]))["written"]))
except FileNotFoundError:
    print(0)' "$tmpdir/state.json"
}
wrote_since () { [ "$(gen)" -gt "$1" ]; }
RANDOM=${SEED:-16}
last=0
for round in 1 2 3 4 5 6; do
    start_server --stderr "$tmpdir/log$round" ctl -f mapper tables="$tmpdir/tables"
    h=$(hydrated)
    echo "round $round: $(ms status c)"
    [ "$h" -ge "$last" ] ||
        die "round $round: $h regions hydrated, $last committed before the kill"
    if [ "$round" != 1 ]; then
        python3 "$torture" check "$sock" c $slot $nslots "$tmpdir/state.json" "$src" ||
            { cat "$tmpdir/log$((round - 1))"; die "round $round: flushed writes lost"; }
    fi
    gen0=$(gen)
    python3 "$torture" write "$sock" c $slot $nslots $round \
            "$tmpdir/state.json" > "$tmpdir/writer$round" 2>&1 &
    writer=$!
    # The kill comes after the writer's first write (connected: a slow,
    # sanitized server takes a while to start).
    wait_for wrote_since "$gen0" ||
        { cat "$tmpdir/writer$round"; die "round $round: the writer wrote nothing"; }
    sleep "0.$((RANDOM % 9 + 1))$((RANDOM % 10))"
    stop_server ctl KILL
    wait $writer || :
    grep -q 'writer stopped' "$tmpdir/writer$round" ||
        { cat "$tmpdir/writer$round"; die "round $round: writer failed"; }
    python3 "$top_srcdir/tests/clone_md.py" check "$md" > "$tmpdir/md$round" ||
        { cat "$tmpdir/md$round"; die "round $round: metadata after kill -9"; }
    head -1 "$tmpdir/md$round"
    # What the kill left committed: hydrated after the restart.
    last=$(sed -n 's/.* hydrated \([0-9]*\) .*/\1/p' "$tmpdir/md$round")
done
start_server --stderr "$tmpdir/log-end" ctl -f mapper tables="$tmpdir/tables"
python3 "$torture" check "$sock" c $slot $nslots "$tmpdir/state.json" "$src" ||
    die "flushed writes lost at the end"
ms message c 0 hydration_threshold 256
ms message c 0 hydration_batch_size 64
clone_hydrated c 1024
nbdsh -u "nbd+unix:///c?socket=$sock" -c '
open("'"$tmpdir/seen"'", "wb").write(h.pread(8 << 20, 0))
'
ms suspend c
cmp "$dest" "$tmpdir/seen" || die "the destination differs from the device"
python3 "$top_srcdir/tests/clone_md.py" check "$md" --all || die "metadata at the end"
ms resume c
stop_server ctl
echo "$0: ok"
