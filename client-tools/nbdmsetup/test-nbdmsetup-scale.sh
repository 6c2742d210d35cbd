#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Many devices (a modest version of bench/bench-scale): 1,000 loaded from
# tables=DIR and 500 more created at run time through nbdmsetup, each a
# linear target over one of 4 shared backing files.  Every device is
# listed, found by name and serves its own data; idle devices hold no
# threads and no file descriptors of their own (/proc); renames and
# removals keep the name index right; a restart loads them all back.
source "$(dirname "$0")/functions-ms.sh"
requires nbdsh --version
requires xargs --version

nload=1000 ncreate=500
for i in 0 1 2 3; do mkfile "b$i.img" 64M > /dev/null; done
table_of () {  # N: device N is 1 MiB of b(N%4) at slot N/4%64
    echo "0 2048 linear $tmpdir/b$(( $1 % 4 )).img $(( ($1 / 4 % 64) * 2048 ))"
}
mkdir "$tmpdir/tables"
for (( i = 0; i < nload; i++ )); do
    table_of "$i" > "$tmpdir/tables/d$i.table"
done
start_server ctl mapper tables="$tmpdir/tables"
pid=$(cat "$tmpdir/ctl.pid")
[ "$(ms ls | wc -l)" -eq "$nload" ] || die "ls after start: $(ms ls | wc -l)"

threads () { awk '$1 == "Threads:" {print $2}' "/proc/$pid/status"; }
fds () { find "/proc/$pid/fd" -mindepth 1 -maxdepth 1 | wc -l; }
ms info d0 > /dev/null
# The clients' connection threads go when they disconnect.
settled () { [ "$(threads)" -eq "$1" ] && [ "$(fds)" -eq "$2" ]; }
thr0=$(steady threads) fd0=$(steady fds)
echo "baseline with $nload devices: threads $thr0, fds $fd0"

# Creates in parallel: the registry takes them concurrently.
for (( i = nload; i < nload + ncreate; i++ )); do
    echo "d$i|$(table_of "$i")"
done | xargs -P 4 -d '\n' -n 1 sh -c '
    IFS="|" read -r name table <<EOT
$1
EOT
    exec "$0" create "$name" --table "$table"' "$NBDMSETUP" ||
    die "parallel creates failed"
n=$(ms ls | wc -l)
[ "$n" -eq $((nload + ncreate)) ] || die "ls after creates: $n"
[ "$(ls "$tmpdir/tables" | wc -l)" -eq $((nload + ncreate)) ] ||
    die "not every create was persisted"
wait_for settled "$thr0" "$fd0" ||
    die "threads $(threads) (was $thr0), fds $(fds) (was $fd0) after $ncreate creates"

# Each device maps its own slot: write a tag through a few, read it back
# from the backing file.
for i in 0 1 777 $((nload + 3)) $((nload + ncreate - 1)); do
    nbdsh -u "nbd+unix:///d$i?socket=$sock" -c "
assert h.get_size() == 2048 * 512
h.pwrite(b'dev $i'.ljust(512, b'.'), 512)
" || die "I/O on d$i"
    off=$(( ($i / 4 % 64) * 1048576 + 512 ))
    got=$(dd if="$tmpdir/b$(( i % 4 )).img" bs=1 skip="$off" count=8 status=none)
    [ "${got%%.*}" = "dev $i" ] || die "d$i wrote '$got' at the wrong place"
done

# The index follows renames and removals.
ms rename d5 renamed5
fails 'no such device' ms info d5
ms info renamed5 | grep -q '^Name: *renamed5$' || die "renamed5"
ms create d5 --table "$(table_of 5)"
fails 'already exists' ms create d5 --table "$(table_of 5)"
for i in 10 11 12 $((nload + 100)); do ms remove "d$i"; done
fails 'no such device' ms info d11
ms info "d$((nload + ncreate - 1))" | grep -q 'Number of targets: 1' ||
    die "info of the newest device"
total=$((nload + ncreate + 1 - 4))
[ "$(ms ls | wc -l)" -eq "$total" ] || die "ls after remove: $(ms ls | wc -l)"
wait_for settled "$thr0" "$fd0" ||
    die "threads $(threads) (was $thr0), fds $(fds) (was $fd0) at the end"

# A restart loads every saved device back.
stop_server ctl
start_server ctl mapper tables="$tmpdir/tables"
[ "$(ms ls | wc -l)" -eq "$total" ] || die "after restart: $(ms ls | wc -l)"
ms info renamed5 > /dev/null || die "renamed5 after restart"
echo "OK: $total devices"
