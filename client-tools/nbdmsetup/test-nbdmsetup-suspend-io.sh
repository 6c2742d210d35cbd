#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Suspend holds I/O (not failed); after load + resume the waiting
# requests complete on the new table.  A size change: new connections see
# the new size; old ones fail cleanly past the new end.
source "$(dirname "$0")/functions-ms.sh"
requires nbdsh --version
requires nbdinfo --version

a=$(mkfile a.img 1M)
b=$(mkfile b.img 1M)
start_server ctl mapper tables="$(mkdir "$tmpdir/t" && echo "$tmpdir/t")"
ms create dev --table "0 2048 linear $a 0"
uri="nbd+unix:///dev?socket=$sock"

for noflush in "" --noflush; do
    : > "$a"; truncate -s 1M "$a"; : > "$b"; truncate -s 1M "$b"
    ms replace dev --table "0 2048 linear $a 0"
    ms suspend $noflush dev
    ms info dev | grep -q '^State:             SUSPENDED$' || die "not suspended"
    rm -f "$tmpdir/written"
    nbdsh -u "$uri" -c '
h.pwrite(b"W" * 4096, 8192, nbd.CMD_FLAG_FUA)
assert h.pread(4096, 8192) == b"W" * 4096
open("'"$tmpdir/written"'", "w").close()
' &
    writer=$!
    # The writer connected and sent its request, which is held.
    for _ in $(seq 100); do
        ms info dev | grep -q '^Open count:        1$' && break
        sleep 0.05
    done
    sleep 0.3
    [ ! -e "$tmpdir/written" ] || die "write completed on a suspended device"
    kill -0 "$writer" || die "writer failed while suspended"
    # The held write runs on the new table: it lands in b, not a.
    ms load dev --table "0 2048 linear $b 0"
    ms resume dev
    wait "$writer" || die "held write failed after resume"
    [ -e "$tmpdir/written" ] || die "writer did not finish"
    cmp -n 4096 -i 8192:0 "$b" <(printf 'W%.0s' $(seq 4096)) ||
        die "held write is not in the new table's file"
    cmp -n 4096 -i 8192:0 "$a" /dev/zero || die "held write reached the old table"
    echo "suspend $noflush: held write completed on the new table"
done

# Size change under an open connection.
ms replace dev --table "0 2048 linear $a 0"
nbdsh -u "$uri" -c '
import subprocess, os
assert h.get_size() == 1048576
subprocess.run([os.environ["NBDMSETUP"], "replace", "dev", "--table",
                "0 1024 linear '"$a"' 0"], check=True)
h.pread(512, 1024 * 512 - 512)       # still inside
try:
    h.pwrite(b"X" * 512, 1024 * 512)  # past the new end
    raise AssertionError("write past the new end succeeded")
except nbd.Error as e:
    assert e.errno in ("ENOSPC", "EIO", "EINVAL"), e
    print("past the new end:", e)
' || die "size change on an old connection"
cmp -n 512 -i 524288:0 "$a" /dev/zero || die "write past the end reached the file"
[ "$(nbdinfo --size "$uri")" = 524288 ] || die "new connection: old size"
echo "$0: ok"
