#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# A suspend whose drain waits for another device: "up" stacks on "low",
# which is suspended, and a read of up is held at low's gate; suspend up
# then waits for that read, i.e. for low's resume.  It waited holding the
# control export's lock, so the resume of low, and every other command,
# waited for it: nothing could ever end it.  Now only changes to up are
# refused meanwhile (busy), the rest runs, and low's resume ends it.
source "$(dirname "$0")/functions-ms.sh"
requires nbdsh --version
stacked_pair
ms suspend low
nbdsh -u "nbd+unix:///up?socket=$sock" \
    -c 'h.pread(512, 0); print("read done", flush=True)' > "$tmpdir/read.out" &
reader=$!
cleanup_fn "kill_job $reader"
# The read is in flight in up (held at low's gate).
in_flight () { ms stats --json up | grep -q '"in_progress": 1'; }
wait_for in_flight || die "the read of up is not in flight"
ms suspend up &
suspender=$!
# Its drain has begun once a change to up is refused as busy.  Each try
# is bounded: before the fix it hung, as every other command did.
for (( i = 0; ; i++ )); do
    rc=0
    timeout 10 "$NBDMSETUP" resume up > "$tmpdir/busy" 2>&1 || rc=$?
    [ "$rc" -ne 124 ] || die "resume up hangs: the control export is blocked"
    grep -q 'waiting for its 1 request in flight' "$tmpdir/busy" && break
    [ "$i" -lt 100 ] || die "resume up never refused as busy: $(cat "$tmpdir/busy")"
    sleep 0.1
done
kill -0 "$suspender" 2>/dev/null || die "suspend up did not wait for the read"
# Other commands run meanwhile; changes to up are refused, and say why.
timeout 10 "$NBDMSETUP" info low > /dev/null || die "info low blocked"
timeout 10 "$NBDMSETUP" ls > /dev/null || die "ls blocked"
fails 'suspend up: another suspend .* is waiting for its requests in flight' \
    timeout 10 "$NBDMSETUP" suspend up
fails "replace: device 'up': a suspend .* is waiting for its 1 request in flight" \
    timeout 10 "$NBDMSETUP" replace up --table "0 2048 zero"
[ "$(ms table up)" = "0 2048 linear mapper:low 0" ] || die "up changed"
# low's resume lets the read on, which ends up's suspend.
timeout 10 "$NBDMSETUP" resume low || die "resume low blocked"
wait "$suspender" || die "suspend up failed"
wait "$reader" || die "the read of up failed"
grep -q 'read done' "$tmpdir/read.out" || die "no read"
ms info up | grep -q '^State:             SUSPENDED$' || die "up not suspended"
ms resume up
ms info up | grep -q '^State:             ACTIVE$' || die "up not active"
echo "$0: ok"
