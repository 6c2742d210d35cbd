#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# One flush per backend through a clone: a client flush that commits
# hydrated regions (the commit first makes their copies durable with a
# flush of the destination) flushes the destination once, not twice, as
# dm-clone's dest_dev_flushed.  The destination is remote behind
# nbdkit's log filter, which counts its flushes; the periodic commit may
# come in between, but whichever comes first leaves the destination
# clean for the other.
source "$(dirname "$0")/functions-ms.sh"
requires nbdsh --version
requires nbdkit --filter=log null --version

src=$(mkfile src.img 4M)
fill_random "$src" $((4 << 20)) 5
dest=$(mkfile dest.img 4M)
md=$(mkfile md.img 1M)
start_server destsrv --filter=log file "$dest" logfile="$tmpdir/dest.log"
mkdir "$tmpdir/t"
start_server ctl -f mapper tables="$tmpdir/t"
uri="nbd+unix:///c?socket=$sock"
flushes () { grep -c ' Flush id=.* \.\.\.$' "$tmpdir/dest.log" || :; }

# 4 KiB regions (8 sectors), hydration off: only the client's partial
# writes hydrate, each its own region.
ms create c --table "0 8192 clone $md nbd+unix:///?socket=$tmpdir/destsrv.sock $src 8 1 no_hydration"
for k in 1 2 3 4 5 6; do
    before=$(flushes)
    nbdsh -u "$uri" -c "h.pwrite(b'p' * 512, 4096 * $k + 512); h.flush()"
    after=$(flushes)
    [ $((after - before)) -eq 1 ] ||
        die "write + flush $k: $((after - before)) flushes of the destination, not 1"
done
ms status c | grep -q ' 8 6/1024 ' || die "status: $(ms status c)"
echo "$0: ok"
