#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# A clone's remove and the server's stop are bounded (the clone's
# STOP_GRACE_NS, then the I/O is given up) whatever it waits for, not
# only a destination flush (test-clone-stop.sh), with remote-timeout an
# hour, and nothing given up is reported durable:
#  1. hydration: the workers' copies hang in the destination's writes
#     (remove, then the same for a server stop): nothing is committed
#     hydrated that was not copied;
#  2. the metadata device (a remote export) hangs in a commit's writes:
#     remove completes; the metadata is the last commit's, or the one
#     that hung (its superblock written last: never a torn one), and
#     a commit given up is not taken for a failure (no fail-mode event).
# No time is asserted: the bounds are the harness's (timeout 60,
# stop_server's 10 s), far below the request timeout.
source "$(dirname "$0")/functions-ms.sh"
requires nbdsh --version
requires nbdkit sh --version
requires timeout --version

src=$(mkfile src.img 4M)
fill_random "$src" $((4 << 20)) 3
dest=$(mkfile dest.img 4M)
mdfile=$(mkfile mdr.img 1M)
# hold_hook METHOD FLAG: the export's METHOD hangs while $tmpdir/FLAG
# exists ($tmpdir/FLAG.seen says it did).
hold_hook ()
{
    echo "if [ \"\$1\" = $1 ] && [ -e '$tmpdir/$2' ]; then
              touch '$tmpdir/$2.seen'
              while [ -e '$tmpdir/$2' ]; do sleep 0.1; done
          fi"
}
file_sh "$tmpdir/dest.sh" "$dest" "$(hold_hook pwrite holdw; hold_hook flush holdf)"
start_server destsrv sh "$tmpdir/dest.sh"
file_sh "$tmpdir/md.sh" "$mdfile" "$(hold_hook pwrite holdmd; hold_hook flush holdmd)"
start_server mdsrv sh "$tmpdir/md.sh"
mkdir "$tmpdir/t"
start_server --stderr "$tmpdir/log" ctl -f mapper tables="$tmpdir/t" \
    remote-timeout=3600
cleanup_fn "rm -f '$tmpdir/holdw' '$tmpdir/holdf' '$tmpdir/holdmd'"
uri="nbd+unix:///c?socket=$sock"
desturi="nbd+unix:///?socket=$tmpdir/destsrv.sock"
mduri="nbd+unix:///?socket=$tmpdir/mdsrv.sock"

# hydrated MD: the hydrated regions the metadata records (clone_md.py).
hydrated ()
{
    python3 "$top_srcdir/tests/clone_md.py" check "$1" > "$tmpdir/md.out" ||
        die "metadata: $(cat "$tmpdir/md.out")"
    sed -n 's/^hydrated: *//p' "$tmpdir/md.out"
}
# hold FLAG: from now on the hooked method hangs; held FLAG: until one did.
hold () { rm -f "$tmpdir/$1.seen"; touch "$tmpdir/$1"; }
held () { wait_for test -e "$tmpdir/$1.seen" || die "nothing hung on $1"; }

# 1. Hydration hung in the destination's writes.
for how in remove stop; do
    md=$(mkfile md-$how.img 1M)
    ms create c --table "0 8192 clone $md $desturi $src 8 1 no_hydration"
    nbdsh -u "$uri" -c "h.pwrite(b'c' * 4096, 4096); h.flush()"
    [ "$(hydrated "$md")" = 1 ] || die "1 $how: after a flush: $(cat "$tmpdir/md.out")"
    hold holdw
    ms message c 0 enable_hydration
    held holdw
    if [ $how = remove ]; then
        timeout 60 "$NBDMSETUP" remove c ||
            die "1: remove did not complete while hydration writes hung"
    else
        stop_server ctl || die "1: the server did not stop while hydration writes hung"
    fi
    [ "$(hydrated "$md")" = 1 ] ||
        die "1 $how: regions never copied are hydrated: $(cat "$tmpdir/md.out")"
    rm -f "$tmpdir/holdw"
    [ $how = stop ] || continue
    start_server --stderr "$tmpdir/log" ctl -f mapper tables="$tmpdir/t" \
        remote-timeout=3600
    ms ls | grep -q '^c' && ms remove c
done

# 2. The metadata device hung in a commit.
: > "$mdfile"; truncate -s 1M "$mdfile"
ms create c --table "0 8192 clone $mduri $desturi $src 8 1 no_hydration"
nbdsh -u "$uri" -c "h.pwrite(b'c' * 4096, 4096); h.flush()"
[ "$(hydrated "$mdfile")" = 1 ] || die "2: after a flush: $(cat "$tmpdir/md.out")"
hold holdmd
nbdsh -u "$uri" -c "h.pwrite(b'm' * 4096, 4096 * 2)"
held holdmd
timeout 60 "$NBDMSETUP" remove c ||
    die "2: remove did not complete while the metadata device hung"
rm -f "$tmpdir/holdmd"
case "$(hydrated "$mdfile")" in
    1|1-2) ;;
    *) die "2: metadata after the hung commit: $(cat "$tmpdir/md.out")" ;;
esac

grep -i "metadata commit failed" "$tmpdir/log" &&
    die "a commit given up at a stop was taken for a failure"
stop_server ctl
stop_server mdsrv
stop_server destsrv
echo "$0: ok"
