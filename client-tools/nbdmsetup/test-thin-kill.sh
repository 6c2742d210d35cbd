#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# kill -9 torture (tests/thin_torture.py): a writer flushing often on a
# thin volume (with a fresh snapshot of it each round, so that writes
# break sharing too), the server killed with SIGKILL at a random moment,
# thin_check on the metadata it left, and after the restart every write
# acknowledged before a successful flush is there.
source "$(dirname "$0")/functions-ms.sh"
requires nbdsh --version
requires thin_check -V

thin_pool 8M 64M 0
ms create t1 --table "0 65536 thin mapper:pool 1"
stop_server ctl

# A flush after nothing but provisioning writes (no write through the
# pool device itself, which a plain flush of it would see), then kill -9
# at once, before the once-a-second commit: the flush must have committed.
for i in 1 2 3 4 5; do
    start_server ctl mapper tables="$tmpdir/tables"
    nbdsh -u "nbd+unix:///t1?socket=$sock" -c "
h.pwrite(bytes([$i]) * 5000, ($i * 7 + 300) * 65536 + 1000)
h.flush()
"
    stop_server ctl KILL
    start_server ctl mapper tables="$tmpdir/tables"
    nbdsh -u "nbd+unix:///t1?socket=$sock" -c "
assert h.pread(5000, ($i * 7 + 300) * 65536 + 1000) == bytes([$i]) * 5000, \
    'a flushed provisioning write is lost'
"  || die "flushed provisioning write $i lost after kill -9"
    stop_server ctl
    thin_check "$md" || die "thin_check after kill -9 ($i)"
done

torture=$top_srcdir/tests/thin_torture.py
slot=20480 nslots=600     # slots of 20 KiB: some cross a 64 KiB block
RANDOM=${SEED:-14}
for round in 1 2 3 4 5 6; do
    start_server --stderr "$tmpdir/log$round" ctl -f mapper tables="$tmpdir/tables"
    if [ "$round" != 1 ]; then
        python3 "$torture" check "$sock" t1 $slot $nslots "$tmpdir/state.json" ||
            { cat "$tmpdir/log$((round - 1))"; die "round $round: flushed writes lost"; }
    fi
    ms message pool 0 delete $((round + 99)) 2>/dev/null || :
    ms suspend t1
    ms message pool 0 create_snap $((round + 100)) 1
    ms resume t1
    python3 "$torture" write "$sock" t1 $slot $nslots $round \
            "$tmpdir/state.json" > "$tmpdir/writer$round" 2>&1 &
    writer=$!
    sleep "0.$((RANDOM % 9 + 1))$((RANDOM % 10))"
    sleep $((RANDOM % 2))
    stop_server ctl KILL
    wait $writer || :
    grep -q 'writer stopped' "$tmpdir/writer$round" ||
        { cat "$tmpdir/writer$round"; die "round $round: writer failed"; }
    thin_check "$md" || die "round $round: thin_check after kill -9"
done
start_server ctl mapper tables="$tmpdir/tables"
python3 "$torture" check "$sock" t1 $slot $nslots "$tmpdir/state.json" ||
    die "flushed writes lost after the last kill"
stop_server ctl
thin_check "$md" || die "thin_check"
echo "$0: ok"
