#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdmsetup reads what the protocol allows, not only what the server
# happens to send, and refuses a response it cannot read rather than
# acting on a guess: rewrite_proxy.py, between nbdmsetup and the real
# server, changes the responses (same length).
source "$(dirname "$0")/functions-ms.sh"
requires python3 --version
f1=$(mkfile f1.img 1M); f2=$(mkfile f2.img 1M); f3=$(mkfile f3.img 1M)
mkdir "$tmpdir/tables"
start_server ctl mapper tables="$tmpdir/tables"
ms create p --table "0 8 linear $f1 0
8 8 linear $f2 0"
ms create q --table "0 8 linear $f3 0"
ms create w --table "0 24 zero"

# proxy NAME OLD NEW: px runs nbdmsetup through a proxy that makes OLD
# NEW in the server's responses; hits NAME is how often it did.
proxy ()
{
    local i
    mkdir "$tmpdir/$1"
    python3 "$top_srcdir/client-tools/nbdmsetup/rewrite_proxy.py" \
        "$tmpdir/$1.sock" "$sock" "$tmpdir/$1" "$2" "$3" &
    cleanup_fn "kill_job $!"
    for (( i = 0; i < 100; i++ )); do
        [ -S "$tmpdir/$1.sock" ] && break
        sleep 0.1
    done
    px_sock=$tmpdir/$1.sock
}
px () { NBDMSETUP_URI="nbd+unix:///control?socket=$px_sock" ms "$@"; }
hits () { cat "$tmpdir/$1/hits" 2>/dev/null || echo 0; }

# status --backends rows of p that are not together are still p's: p's
# second backend was taken from the row after its first (q's).
proxy order "p\\t$f2\\tfile\\topen\\nq\\t$f3\\tfile\\topen\\n" \
    "q\\t$f3\\tfile\\topen\\np\\t$f2\\tfile\\topen\\n"
px status --backends
[ "$(hits order)" -ge 1 ] || die "the proxy reordered nothing"
out=$(px deps)
echo "$out"
[ "$out" = "p: 2 dependencies	: ($f1) ($f2)
q: 1 dependencies	: ($f3)
w: 0 dependencies	:" ] || die "deps with the rows reordered: $out"

# wipe_table of a size that is not whole sectors, or not a number:
# refused; it replaced w with a shorter error table (23 sectors, 2).
for bad in 12287 1228x; do
    proxy "size-$bad" "\\t12288\\t" "\\t$bad\\t"
    fails "wipe_table w: malformed response \\(size '$bad'\\)" px wipe_table w
    [ "$(hits "size-$bad")" -ge 1 ] || die "size not rewritten"
    [ "$(ms table w)" = "0 24 zero" ] || die "w changed: $(ms table w)"
done

# clients: a time or a count that is not a number is refused; the time
# read as 1970, the count went into the JSON as it was.
nbdsh -u "nbd+unix:///q?socket=$sock" -c 'import time; time.sleep(30)' &
client=$!
cleanup_fn "kill_job $client"
[ "$(steady ms clients q | wc -l)" -eq 2 ] || die "q's client not listed"
proxy since "\\t0\\t1" "\\t0\\tx"
fails 'clients: malformed response \(row [12]\)' px clients
proxy count "\\t0\\t0\\n" "\\t0\\tx\\n"
fails 'clients: malformed response \(row [12]\)' px --json clients
[ "$(hits since)" -ge 1 ] && [ "$(hits count)" -ge 1 ] ||
    die "clients not rewritten"
kill $client

# info -c --json is refused before connecting (it was after the
# requests, and the message was after a connection error).
fails 'info -c: --json gives every field already' \
    ms -a "nbd+unix:///control?socket=$tmpdir/nosock" --json info -c
echo "$0: ok"
