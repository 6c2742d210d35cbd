#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# A multipath device over three NBD servers of different kinds over one
# file: nbdkit file, qemu-nbd and nbd-server, one round-robin group.
#
#  1. fio --verify runs while each server in turn is killed with SIGKILL
#     and restarted: fio sees no error, the path is failed (status F,
#     fail count 1, a logged event) and the path checker reinstates it
#     once its server is back.  The failover is the lost connection's
#     (a remote path's clones fail fast), not remote-timeout's (600 s)
#     nor the path timeout's (5 s here: with 1 s, under load, a flush
#     slowed by a busy disk was taken for a dead path now and then, and
#     the fail counts below came out 2 or 3; test-multipath-netns.sh and
#     test-multipath-stall.sh test the path timeout).  The device then
#     reads back the file.
#     A server killed and left down until the end of a fio run (which
#     flushes every 16 writes): no error either, the flushes do without
#     it.
#  2. fail_path and reinstate_path under load: two paths failed by
#     message, fio goes on through the third; failed by message, a path
#     stays failed (the checker leaves it) until reinstate_path.
#  3. Bad messages through nbdmsetup: exit 1, a message naming the
#     problem, and status unchanged; a table whose paths differ in size
#     is refused, naming the path.
source "${top_srcdir:-$(dirname "$0")/..}/tests/functions-mpath.sh"

requires nbdkit --version
requires qemu-nbd --version
requires nbd-server -V
requires nbdcopy --version
requires fio --version
requires sh -c 'fio --enghelp=nbd 2>&1 | grep -q uri'

disk=$(mkfile disk.img 16M)
fill_random "$disk" 16777216 5
kit k "$disk"
qemu q "$disk"
nbds n "$disk"
K=$(kit_uri k) Q=$(qemu_uri q) N=$(nbds_uri n)

cat > "$tmpdir/m.table" <<EOT
0 32768 multipath 4 checker_interval_msecs 200 path_timeout_msecs 5000 0 1 1 round-robin 0 3 0 $K $Q $N
EOT
start_mapper "$tmpdir/m.table" remote-timeout=600
ms status m
[ "$(ms status m)" = "0 32768 multipath 2 0 0 0 1 1 E 0 3 0 $K A 0 $Q A 0 $N A 0" ] ||
    die "status of a fresh device: $(ms status m)"

# --- 1. each server killed and restarted under fio --verify -------------
fio_start kill 14
sleep 1
for s in k q n; do
    case $s in k) u=$K ;; q) u=$Q ;; n) u=$N ;; esac
    ev=$(ms info m | sed -n 's/^Event number: *//p')
    kill9 $s
    wait_path "$u" F
    kill -0 "$fio" || { cat "$tmpdir/kill.fio"; die "fio ended early"; }
    case $s in k) kit k "$disk" ;; q) qemu q "$disk" ;; n) nbds n "$disk" ;; esac
    wait_path "$u" A
    now=$(ms info m | sed -n 's/^Event number: *//p')
    [ "$now" -ge $((ev + 2)) ] || die "no event for $s failing and coming back"
    echo "$s killed and restarted: $(ms status m)"
done
fio_check kill
status_ends " $K A 1 $Q A 1 $N A 1"
logged "multipath: device m: path $(re "$K") failed \(.*\), 2 of 3 paths left"
logged "multipath: device m: path $(re "$N") reinstated \(path checker\), 3 of 3 paths active"
same_data "$disk"

# --- 1b. a server down for the rest of a run: flushes need not reach it
# (the writes it carried are covered by flushes on the others).
fio_start down 5
sleep 1
kill9 q
wait_path "$Q" F
fio_check down
qemu q "$disk"
wait_path "$Q" A
same_data "$disk"

# --- 2. fail_path / reinstate_path under load ---------------------------
fio_start msg 6
sleep 1
ms message m 0 fail_path "$K"
ms message m 0 fail_path "$Q"
path_is "$K" F && path_is "$Q" F && path_is "$N" A ||
    die "after fail_path: $(ms status m)"
sleep 1.5                       # checker runs every 200 ms: it leaves them
path_is "$K" F && path_is "$Q" F || die "the checker reinstated a path failed by message"
ms message m 0 reinstate_path "$K"
ms message m 0 reinstate_path "$Q"
fio_check msg
status_ends " $K A 2 $Q A 3 $N A 1"
logged "path $(re "$K") failed \(fail_path message\), 2 of 3 paths left"
logged "path $(re "$Q") reinstated \(message\), 3 of 3 paths active"
same_data "$disk"

# --- 3. bad input ---------------------------------------------------------
before=$(ms status m)
bad ()
{
    local pat=$1 rc=0; shift
    ms message m 0 "$@" 2> "$tmpdir/bad.err" || rc=$?
    [ "$rc" -eq 1 ] || die "message $*: exit $rc, not 1"
    grep -Fq -- "$pat" "$tmpdir/bad.err" ||
        die "message $*: '$(cat "$tmpdir/bad.err")' does not match /$pat/"
    [ "$(ms status m)" = "$before" ] || die "message $* changed status"
    echo "refused: $(cat "$tmpdir/bad.err")"
}
bad "unrecognised multipath message 'reboot'" reboot
bad "fail_path takes 1 argument, got 0" fail_path
bad "fail_path: no path 'nbd://nowhere/' in this target" fail_path nbd://nowhere/
bad "reinstate_path takes 1 argument, got 2" reinstate_path "$K" "$Q"
bad "switch_group: invalid priority group '2' (1 to 1)" switch_group 2
bad "disable_group: invalid priority group 'one' (1 to 1)" disable_group one
bad "enable_group: invalid priority group '0' (1 to 1)" enable_group 0
bad "queue_if_no_path takes no argument, got 1" queue_if_no_path now
stop_server ctl

# A path of another size: refused at start, naming it.
small=$(mkfile small.img 8M)
kit s "$small"
S=$(kit_uri s)
echo "0 16384 multipath 0 0 1 1 round-robin 0 2 0 $K $S" > "$tmpdir/bad.table"
mapper_refuses "bad.table:1: multipath: priority group 1: path $(re "$S"): size 16384 sectors differs from path $(re "$K")'s \(32768 sectors\)" \
    "$tmpdir/bad.table"
echo "$0: ok"
