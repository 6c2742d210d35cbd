#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The control plane with stacked devices (mapper:NAME): a device another
# one stacks on can't be removed (even with --force) nor renamed, and
# info shows its holder apart from connections; a load or replace that
# would make a cycle is refused and changes nothing; replacing the lower
# device's table under the upper one keeps the data path working.
source "$(dirname "$0")/functions-ms.sh"
requires nbdsh --version

a=$(mkfile a.img 1M)
start_server ctl mapper tables="$(mkdir "$tmpdir/t" && echo "$tmpdir/t")"
ms create low --table "0 2048 linear $a 0"
ms create up --table "0 1024 linear mapper:low 1024"
# A holder is not a client connection: info shows them apart, and the
# refusals name the holder.
ms info low | grep -q '^Open count:        0$' || die "a holder counted as a connection"
ms info low | grep -q '^Holders:           up$' || die "info does not show the holder"
[ "$(ms --json info low | python3 -c 'import json,sys; print(json.load(sys.stdin)["devices"][0]["holders"])')" = "['up']" ] ||
    die "info --json holders"
# Named once, though both of its tables stack on low.
ms load up --table "0 8 linear mapper:low 8"
ms info low | grep -q '^Holders:           up$' ||
    die "a holder with two tables on low: $(ms info low | grep Holders)"
ms clear up
fails "in use by device 'up' as mapper:low" ms remove low
fails "in use by device 'up' as mapper:low" ms remove --force low
before=$(ms table)
fails 'cycle' ms load low --table "0 1024 linear mapper:up 0
1024 1024 linear $a 1024"
fails 'cycle' ms replace low --table "0 1024 linear mapper:up 0
1024 1024 linear $a 1024"
fails 'itself|no live table|no such device' ms replace up --table "0 8 linear mapper:up 0"
[ "$(ms table)" = "$before" ] || die "a refused cycle changed a table"
ms replace low --table "0 1000 linear $a 0
1000 1048 linear $a 1000"
nbdsh -u "nbd+unix:///up?socket=$sock" -c '
h.pwrite(b"S" * 4096, 0)
assert h.pread(4096, 0) == b"S" * 4096
'
cmp -n 4096 -i 524288:0 "$a" <(printf 'S%.0s' $(seq 4096)) ||
    die "write through the stack did not land at sector 1024 of a"
# Renaming the lower device would orphan up's mapper:low (and break the
# next start from tables=DIR): refused while a table stacks on it.
fails "in use by device 'up' as mapper:low: it cannot be renamed" ms rename low low2
ms info low >/dev/null || die "refused rename changed the name"
ms remove up
ms rename low low2
ms rename low2 low
ms info low | grep -q '^Holders' && die "low still held after remove up"
ms remove low
[ "$(ms ls)" = "No devices found" ] || die "devices left: $(ms ls)"
echo "$0: ok"
