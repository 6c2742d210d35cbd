#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# A replace, or a resume that swaps in a loaded table, waits for the
# device's requests in flight, as a suspend does (test-nbdmsetup-suspend-
# stacked.sh): "up" stacks on "low", which is suspended, and a read of up
# is held at low's gate, so the swap of up waits for low's resume.  It
# waited holding the control export's lock: the resume of low, and every
# other command, waited for it, and nothing could ever end it.  Now the
# wait is made without the lock: changes to up are refused meanwhile
# (busy), the rest runs, and low's resume ends it.
source "$(dirname "$0")/functions-ms.sh"
requires nbdsh --version
stacked_pair
busy='waiting for its 1 request in flight'

# hold_read: suspend low, then read up in the background (held at low's
# gate, in flight in up).
hold_read ()
{
    ms suspend low
    nbdsh -u "nbd+unix:///up?socket=$sock" \
        -c 'h.pread(512, 0); print("read done", flush=True)' \
        > "$tmpdir/read.out" &
    reader=$!
    cleanup_fn "kill $reader 2>/dev/null"
    in_flight () { ms stats --json up | grep -q '"in_progress": 1'; }
    wait_for in_flight || die "the read of up is not in flight"
}

# swap_waits WHAT CMD...: CMD (in the background) waits for the read;
# meanwhile other commands run, changes to up are refused and change
# nothing, and low's resume lets the read on and CMD end.
swap_waits ()
{
    local what=$1
    shift
    "$@" > "$tmpdir/swap.out" 2>&1 &
    swapper=$!
    # Its drain has begun once a change to up is refused as busy.
    until_busy "$what" up "$busy" "$swapper" "$tmpdir/swap.out"
    kill -0 "$swapper" 2>/dev/null || die "$what did not wait for the read"
    timeout 10 "$NBDMSETUP" info low > /dev/null || die "$what: info low blocked"
    timeout 10 "$NBDMSETUP" ls > /dev/null || die "$what: ls blocked"
    files=$(cd "$tmpdir/t" && ls)
    fails "clear: device 'up': .*$busy" timeout 10 "$NBDMSETUP" clear up
    fails "load: device 'up': .*$busy" \
        timeout 10 "$NBDMSETUP" load up --table "0 2048 error"
    fails "rename: device 'up': .*$busy" timeout 10 "$NBDMSETUP" rename up up2
    fails "remove: device 'up': .*$busy" \
        timeout 10 "$NBDMSETUP" remove --force up
    fails "waiting for its requests in flight" \
        timeout 10 "$NBDMSETUP" suspend up
    fails "$busy" timeout 10 "$NBDMSETUP" resume up
    fails "$busy" timeout 10 "$NBDMSETUP" replace up --table "0 2048 error"
    [ "$(ms table up)" = "0 2048 linear mapper:low 0" ] || die "$what: up changed"
    [ "$(cd "$tmpdir/t" && ls)" = "$files" ] || die "$what: tables=DIR changed"
    # low's resume lets the read on, which ends the swap's wait.
    timeout 10 "$NBDMSETUP" resume low || die "$what: resume low blocked"
    wait "$swapper" || die "$what failed: $(cat "$tmpdir/swap.out")"
    wait "$reader" || die "$what: the read of up failed"
    grep -q 'read done' "$tmpdir/read.out" || die "$what: no read"
    [ "$(ms table up)" = "0 2048 zero" ] || die "$what: not swapped"
    grep -q "^0 2048 zero" "$tmpdir/t/up.table" || die "$what: not saved"
    ms info up | grep -q '^State:             ACTIVE$' || die "$what: up not active"
}

hold_read
swap_waits replace ms replace up --table "0 2048 zero"

ms replace up --table "0 2048 linear mapper:low 0"
ms load up --table "0 2048 zero"
hold_read
swap_waits resume ms resume up
ms table --inactive up | grep -q . && die "an inactive table is left"
echo "$0: ok"
