#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# A failed backend flush during a control command is never dropped:
# - suspend fails, and the device carries on running (dm's __dm_suspend);
# - resume with an inactive table fails, the live table stays and the
#   new one stays inactive (dm's do_resume), and tables=DIR keeps the
#   live one;
# - replace whose flush of the backends it drops fails after the swap
#   says so (the new table is live and saved), and a client connection
#   open across it fails its next flush: the writes it made to the
#   dropped backend may be gone.
source "$(dirname "$0")/functions-ms.sh"
requires nbdsh --version
requires nbdkit sh --version

# A remote backend whose flushes fail while $tmpdir/fail exists.
r=$(mkfile r.img 1M)
file_sh "$tmpdir/r.sh" "$r" : "if [ -e '$tmpdir/fail' ]; then
               echo 'EIO injected flush failure' >&2; exit 1
           fi"
start_server r sh "$tmpdir/r.sh"
remote="nbd+unix:///?socket=$tmpdir/r.sock"

a=$(mkfile a.img 1M)
dir=$tmpdir/t
mkdir "$dir"
start_server ctl mapper tables="$dir"
ms create d --table "0 2048 linear $remote 0"
write () { nbdsh -u "nbd+unix:///d?socket=$sock" -c 'h.pwrite(b"x" * 4096, 0)'; }
state () { ms info d | sed -n 's/^State: *//p'; }

# --- suspend --------------------------------------------------------------
write
touch "$tmpdir/fail"
fails 'suspend d: flush failed' ms suspend d
[ "$(state)" = ACTIVE ] || die "a failed suspend left the device $(state)"
nbdsh -u "nbd+unix:///d?socket=$sock" -c 'h.pread(512, 0)' ||
    die "the device does not serve after a failed suspend"

# --- resume with an inactive table -------------------------------------------
ms load d --table "0 2048 linear $a 0"
fails "flush before the swap failed.*the live table stays, the new one inactive" \
    ms resume d
[ "$(ms table d)" = "0 2048 linear $remote 0" ] || die "live table: $(ms table d)"
ms info d | grep -q '^Tables present:    LIVE & INACTIVE$' ||
    die "the new table did not stay inactive"
[ "$(state)" = ACTIVE ] || die "a failed resume left the device $(state)"
grep -q "linear $remote 0" "$dir/d.table" || die "d.table: $(cat "$dir/d.table")"
rm "$tmpdir/fail"
ms resume d                     # the flush works again: now it swaps
[ "$(ms table d)" = "0 2048 linear $a 0" ] || die "resume did not swap"

# --- replace that cannot flush what it drops ----------------------------------
ms replace d --table "0 2048 linear $remote 0"
nbdsh -u "nbd+unix:///d?socket=$sock" -c '
import subprocess
from nbdcheck import fails_eio
h.pwrite(b"y" * 4096, 0)            # acknowledged, not flushed
subprocess.check_call(["'"$NBDMSETUP"'", "suspend", "--noflush", "d"])
open("'"$tmpdir"'/fail", "w").close()
r = subprocess.run(["'"$NBDMSETUP"'", "replace", "d", "--table",
                    "0 2048 linear '"$a"' 0"], capture_output=True, text=True)
print(r.stderr, end="")
assert r.returncode == 1, "replace: exit %d" % r.returncode
assert "the new table is live, but flushing the backends it no longer " \
       "uses failed" in r.stderr, r.stderr
# This connection wrote to the dropped backend: its next flush fails once.
assert fails_eio(h.flush), "flush after the lost writes succeeded"
h.flush()
'
[ "$(ms table d)" = "0 2048 linear $a 0" ] || die "replace did not swap"
grep -q "linear $a 0" "$dir/d.table" || die "the live table is not saved"
[ "$(state)" = ACTIVE ] || die "after replace: $(state)"
rm "$tmpdir/fail"
echo "$0: ok"
