#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Many clients (a modest version of bench/bench-scale's): 64 connections
# to one device, then 8 to each of 4 devices, every one doing verified
# I/O (fio nbd engine, one thread and one connection per job, random
# writes then crc32c verification of its own region), while
# "nbdmsetup replace" keeps swapping the devices' tables between one and
# two targets over the same data.  No I/O error, no verification error,
# every replace completes, and afterwards the server is back to its idle
# thread count.
source "$(dirname "$0")/functions-ms.sh"
requires fio --version
requires sh -c 'fio --enghelp=nbd 2>&1 | grep -q uri'

back=$(mkfile back.img 64M)
bsec=32768                                # 16 MiB per device
mkdir "$tmpdir/tables"
for i in 0 1 2 3; do
    echo "0 $bsec linear $back $(( i * bsec ))" > "$tmpdir/tables/c$i.table"
done
start_server ctl -t 2 mapper tables="$tmpdir/tables"
pid=$(cat "$tmpdir/ctl.pid")
threads () { awk '$1 == "Threads:" {print $2}' "/proc/$pid/status"; }
ms ls > /dev/null
thr0=$(steady threads)

# replacer DEV...: swap tables until $tmpdir/stop exists.
replacer ()
{
    local n=0 half=$(( bsec / 2 )) d base t
    while [ ! -e "$tmpdir/stop" ]; do
        for d in "$@"; do
            base=$(( ${d#c} * bsec ))
            if (( n % 2 )); then
                t="0 $bsec linear $back $base"
            else
                t="0 $half linear $back $base
$half $half linear $back $(( base + half ))"
            fi
            ms replace "$d" --table "$t" ||
                { echo "replace $d failed" > "$tmpdir/repfail"; return 1; }
            n=$((n + 1))
        done
        sleep 0.05
    done
    echo "$n" > "$tmpdir/nrep"
}

# run_fio JOBFILE NJOBS DEV...: fio with replaces of DEV... going on.
run_fio ()
{
    local job=$1 njobs=$2 rc=0 rp
    shift 2
    rm -f "$tmpdir/stop" "$tmpdir/nrep" "$tmpdir/repfail"
    replacer "$@" & rp=$!
    (cd "$tmpdir" && fio "$job") > "$tmpdir/fio.out" 2>&1 || rc=$?
    touch "$tmpdir/stop"
    wait "$rp" || :
    if [ "$rc" -ne 0 ] ||
       grep -Ei 'verify.*(fail|bad)|bad magic|crc32c.*wanted|err= *[1-9]' "$tmpdir/fio.out"; then
        cat "$tmpdir/fio.out"; die "fio $job: exit $rc"
    fi
    [ ! -e "$tmpdir/repfail" ] || die "$(cat "$tmpdir/repfail")"
    [ -s "$tmpdir/nrep" ] && [ "$(cat "$tmpdir/nrep")" -ge 1 ] || die "no replace ran"
    [ "$(grep -c 'err= 0' "$tmpdir/fio.out")" -eq "$njobs" ] ||
        { cat "$tmpdir/fio.out"; die "$job: not $njobs jobs"; }
    echo "$job: $njobs jobs OK, $(cat "$tmpdir/nrep") replaces during"
}

common="ioengine=nbd
thread=1
rw=randwrite
bs=4k
iodepth=4
verify=crc32c
verify_fatal=1
do_verify=1
verify_state_save=0"

cat > "$tmpdir/one.fio" <<EOT
[global]
$common
uri=nbd+unix:///c0?socket=$sock
size=256K
offset_increment=256K
numjobs=64
[c0]
EOT
run_fio "$tmpdir/one.fio" 64 c0

{
    echo "[global]"; echo "$common"
    echo "size=2M"; echo "offset_increment=2M"; echo "numjobs=8"
    for i in 0 1 2 3; do echo "[c$i]"; echo "uri=nbd+unix:///c$i?socket=$sock"; done
} > "$tmpdir/four.fio"
run_fio "$tmpdir/four.fio" 32 c0 c1 c2 c3

# Every connection is gone: their threads too.
idle () { [ "$(threads)" -eq "$thr0" ]; }
wait_for idle || die "threads $(threads), idle was $thr0"
