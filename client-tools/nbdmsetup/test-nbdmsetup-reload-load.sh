#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Reload under load: fio (nbd engine) writes and verifies (crc32c,
# interleaved and at the end) while 100 replace calls alternate between
# three equivalent tables over the same file.  Zero I/O errors, clean
# verify, the device and the file agree afterwards.
source "$(dirname "$0")/functions-ms.sh"
requires fio --version
requires sh -c 'fio --enghelp=nbd 2>&1 | grep -q uri'

f=$(mkfile f.img 16M)
t1="0 32768 linear $f 0"
t2="0 16384 linear $f 0
16384 16384 linear $f 16384"
t3="0 1000 linear $f 0
1000 31768 linear $f 1000"
start_server ctl mapper tables="$(mkdir "$tmpdir/t" && echo "$tmpdir/t")"
ms create dev --table "$t1"
ev0=$(ms info --json dev | python3 -c 'import json,sys; print(json.load(sys.stdin)["devices"][0]["event_nr"])')

cd "$tmpdir"
# fio passes back to back until the replaces are done (each pass writes
# and verifies; a pass is short, so the load covers every replace).
fio_loop ()
{
    local pass=0
    while [ ! -e "$tmpdir/replaces.done" ] || [ $pass -lt 2 ]; do
        pass=$((pass + 1))
        fio --name=reload$pass --ioengine=nbd \
            --uri="nbd+unix:///dev?socket=$sock" \
            --rw=randwrite --bs=4k --iodepth=16 --direct=1 \
            --verify=crc32c --do_verify=1 --verify_backlog=256 \
            --verify_fatal=1 --verify_state_save=0 --randseed=$pass \
            --numjobs=2 --offset_increment=8M --size=8M --loops=4 \
            --group_reporting > "$tmpdir/fio.out" 2>&1 || {
            cat "$tmpdir/fio.out"; echo "fio pass $pass failed"; return 1; }
        if grep -Ei 'verify.*(fail|bad)|bad magic|crc32c.*wanted|err= *[1-9]' \
                "$tmpdir/fio.out"; then
            cat "$tmpdir/fio.out"; echo "fio pass $pass: errors"; return 1
        fi
    done
    echo "$pass fio passes"
}
fio_loop > "$tmpdir/fio.log" 2>&1 &
fio_pid=$!
n=0
for i in $(seq 100); do
    case $((i % 3)) in 0) t=$t1 ;; 1) t=$t2 ;; 2) t=$t3 ;; esac
    ms replace dev --table "$t" || die "replace $i failed"
    n=$((n + 1))
done
touch "$tmpdir/replaces.done"
rc=0
wait "$fio_pid" || rc=$?
cat "$tmpdir/fio.log"
[ "$rc" -eq 0 ] || die "fio failed under reload"
ev1=$(ms info --json dev | python3 -c 'import json,sys; print(json.load(sys.stdin)["devices"][0]["event_nr"])')
[ $((ev1 - ev0)) -eq 100 ] || die "event counter moved by $((ev1 - ev0)), not 100"
echo "$n replaces under load, events $ev0 -> $ev1"
nbdcopy "nbd+unix:///dev?socket=$sock" "$tmpdir/dev.out"
cmp "$tmpdir/dev.out" "$f" || die "device and file differ"
echo "$0: ok"
