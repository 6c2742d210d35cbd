#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# A metadata device that starts failing (mapper:meta, reloaded with an
# error table under the running pool): the commit a flush asks for
# fails, the flush fails with EIO and so does every later one (the
# writes since the last commit are gone), the pool turns read-only
# (status ro, needs_check; logged and an event), writes that need a new
# block fail with EIO, reads of committed blocks go on, and messages are
# refused.  Then the pool is reloaded after the metadata device is back:
# it comes up at its last commit, and thin_check accepts it.  A thin
# status that cannot read its mapping tree says Error, and the flushes
# after it fail.
source "$(dirname "$0")/functions-ms.sh"
requires nbdsh --version
requires thin_check -V

md=$(mkfile md.img 4M)
data=$(mkfile data.img 16M)
mkdir "$tmpdir/tables"
start_server --stderr "$tmpdir/log" ctl -f mapper tables="$tmpdir/tables"
ms create meta --table "0 8192 linear $md 0"
ms create pool --table "0 32768 thin-pool mapper:meta $data 128 0"
ms message pool 0 create_thin 1
ms create t1 --table "0 16384 thin mapper:pool 1"
uri="nbd+unix:///t1?socket=$sock"
nbdsh -u "$uri" -c 'h.pwrite(b"\1" * 65536, 0); h.flush()'

e=$(ev pool)
ms replace meta --table "0 8192 error"
nbdsh -u "$uri" -c '
import errno
h.pwrite(b"\2" * 65536, 65536)          # a new block, not committed yet
for i in range(2):
    try:
        h.flush()
        assert False, "a flush reported durable after the commit failed"
    except nbd.Error as e:
        assert e.errnum == errno.EIO, e
try:
    h.pwrite(b"\3" * 4096, 5 * 65536)
    assert False, "a write needing a block worked on a read-only pool"
except nbd.Error as e:
    assert e.errnum == errno.EIO, e
assert h.pread(65536, 0) == b"\1" * 65536
' || die "failed commit"
ms status pool | grep -Eq '^0 32768 thin-pool 0 [0-9]+/1024 [0-9]+/256 - ro discard_passdown queue_if_no_space needs_check ' ||
    die "status after the failed commit: $(ms status pool)"
[ "$(ev pool)" -gt "$e" ] || die "no event for the mode change"
grep -q 'switching pool to read-only mode: metadata commit failed' "$tmpdir/log" ||
    { cat "$tmpdir/log"; die "mode change not logged"; }
fails 'create_thin: the pool is read-only' ms message pool 0 create_thin 2

# Back: the metadata device works again, the pool is reloaded from it.
ms remove t1
ms remove pool
ms replace meta --table "0 8192 linear $md 0"
ms create pool --table "0 32768 thin-pool mapper:meta $data 128 0"
ms create t1 --table "0 16384 thin mapper:pool 1"
nbdsh -u "$uri" -c '
assert h.pread(65536, 0) == b"\1" * 65536
assert h.pread(65536, 65536) == bytes(65536)     # never committed
'
ms status t1 | grep -q '^0 16384 thin 128 127$' || die "status: $(ms status t1)"

# A thin status that cannot read the mapping tree says Error, as dm's,
# not that nothing is mapped: a new pool object (nothing cached) over a
# metadata device that fails once the thin device is loaded.
ms remove t1
ms remove pool
ms create pool --table "0 32768 thin-pool mapper:meta $data 128 0"
ms create t1 --table "0 16384 thin mapper:pool 1"
ms replace meta --table "0 8192 error"
[ "$(ms status t1)" = "0 16384 thin Error" ] ||
    die "status over unreadable metadata: $(ms status t1)"
# That failed the metadata, with nothing changed: a flush must not say
# durable, and the pool is read-only.
nbdsh -u "$uri" -c '
import errno
try:
    h.flush()
    assert False, "a flush worked after the metadata failed"
except nbd.Error as e:
    assert e.errnum == errno.EIO, e
' || die "flush after a failed lookup"
ms status pool | grep -q ' ro discard_passdown ' ||
    die "status after the failed lookup: $(ms status pool)"
ms replace meta --table "0 8192 linear $md 0"
ms remove t1
ms remove pool
stop_server ctl
thin_check "$md" || die "thin_check"
echo "$0: ok"
