#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# A clone whose destination stops answering flushes (a remote export
# whose flush hangs while $tmpdir/hold exists; remote-timeout an hour):
# worker 0's periodic commit hangs in the destination's flush.  Then
#  1. nbdmsetup remove completes (the commit's flush is given up, not
#     waited out to the request timeout), and the metadata does not say
#     the region written since the last commit is hydrated (its copy's
#     durability was never confirmed);
#  2. the same for a server stop (SIGTERM: stop_server fails the test if
#     the server is still there 10 s later);
#  3. remove again with a multi-conn destination, whose flush goes inline
#     (a worker's poll on a direct connection, which the abandon reaches
#     only through drop_wanted: it used to sleep out remote-timeout).
# No time is asserted: the bounds are the harness's, far below the
# request timeout.
source "$(dirname "$0")/functions-ms.sh"
requires nbdsh --version
requires nbdkit sh --version
requires timeout --version

src=$(mkfile src.img 4M)
fill_random "$src" $((4 << 20)) 3
dest=$(mkfile dest.img 4M)
file_sh "$tmpdir/dest.sh" "$dest" : "if [ -e '$tmpdir/hold' ]; then
               touch '$tmpdir/holding'
               while [ -e '$tmpdir/hold' ]; do sleep 0.1; done
           fi"
start_server destsrv sh "$tmpdir/dest.sh"
# The same export, multi-conn: the mapper's connections 1-3 go direct.
sed 's/can_write|can_flush)/can_write|can_flush|can_multi_conn)/' \
    "$tmpdir/dest.sh" > "$tmpdir/destmc.sh"
chmod +x "$tmpdir/destmc.sh"
start_server destmc sh "$tmpdir/destmc.sh"
mkdir "$tmpdir/t"
start_server --stderr "$tmpdir/log" ctl -f mapper tables="$tmpdir/t" \
    remote-timeout=3600
cleanup_fn "rm -f '$tmpdir/hold'"
uri="nbd+unix:///c?socket=$sock"

# hydrated MD: the hydrated regions the metadata records (clone_md.py).
hydrated ()
{
    python3 "$top_srcdir/tests/clone_md.py" check "$1" > "$tmpdir/md.out" ||
        die "metadata: $(cat "$tmpdir/md.out")"
    sed -n 's/^hydrated: *//p' "$tmpdir/md.out"
}

# Region N (4 KiB regions) overwritten whole, then held in the commit.
# The hold first: worker 0's commit (once a second) between the write
# and a hold set after it flushed the destination unheld, and then had
# nothing more to commit (seen under load).
write_and_hold ()
{
    rm -f "$tmpdir/holding"
    touch "$tmpdir/hold"
    nbdsh -u "$uri" -c "h.pwrite(b'w' * 4096, 4096 * $1)"
    wait_for test -e "$tmpdir/holding" || die "no commit reached the destination"
}

for how in remove stop inline; do
    md=$(mkfile md-$how.img 1M)
    desturi="nbd+unix:///?socket=$tmpdir/destsrv.sock"
    [ $how = inline ] && desturi="nbd+unix:///?socket=$tmpdir/destmc.sock"
    if [ $how = inline ]; then
        mkdir "$tmpdir/t2"
        start_server --stderr "$tmpdir/log" ctl -f mapper tables="$tmpdir/t2" \
            remote-timeout=3600
    fi
    ms create c --table "0 8192 clone $md $desturi $src 8 1 no_hydration"
    nbdsh -u "$uri" -c "h.pwrite(b'c' * 4096, 4096); h.flush()"
    [ "$(hydrated "$md")" = 1 ] || die "$how: after a flush: $(cat "$tmpdir/md.out")"
    if [ $how = inline ]; then
        # Flushes until one has gone inline: the loop parks its idle
        # direct connections only once a request could have.
        for i in $(seq 50); do
            nbdsh -u "$uri" -c "h.pwrite(b'i' * 4096, 4096 * 3); h.flush()"
            ms status --backends c | grep -q "$tmpdir/destmc.sock: .* [1-9][0-9]* inline" &&
                break
        done
        ms status --backends c | grep -q "$tmpdir/destmc.sock: .* [1-9][0-9]* inline" ||
            die "nothing went inline: $(ms status --backends c)"
    fi
    before=$(hydrated "$md")
    write_and_hold 2
    if [ $how != stop ]; then
        timeout 60 "$NBDMSETUP" remove c ||
            die "remove did not complete while a commit's flush hung"
        ms ls | grep -q '^c' && die "c still there"
    else
        stop_server ctl || die "the server did not stop while a commit's flush hung"
    fi
    # Region 2's copy was never confirmed durable: not committed.
    [ "$(hydrated "$md")" = "$before" ] ||
        die "$how: uncommitted regions in the metadata: $(cat "$tmpdir/md.out")"
    rm -f "$tmpdir/hold"
done
grep -i "metadata commit failed" "$tmpdir/log" &&
    die "a commit given up at a stop was taken for a failure"
stop_server ctl
stop_server destmc
stop_server destsrv
echo "$0: ok"
