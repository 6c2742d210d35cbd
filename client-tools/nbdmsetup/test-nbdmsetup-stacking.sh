#!/usr/bin/env bash
# The control plane with stacked devices (mapper:NAME): a device another
# one stacks on can't be removed without --force nor renamed; a load or replace that
# would make a cycle is refused and changes nothing; replacing the lower
# device's table under the upper one keeps the data path working.
source "$(dirname "$0")/functions-ms.sh"
requires nbdsh --version

a=$(mkfile a.img 1M)
start_server tables="$(mkdir "$tmpdir/t" && echo "$tmpdir/t")"
ms create low --table "0 2048 linear $a 0"
ms create up --table "0 1024 linear mapper:low 1024"
ms info low | grep -q '^Open count:        1$' || die "stacking does not hold low open"
fails 'open by 1 connection' ms remove low
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
fails 'used by 1 table as mapper:low' ms rename low low2
ms info low >/dev/null || die "refused rename changed the name"
ms remove up
ms rename low low2
ms rename low2 low
ms info low | grep -q '^Open count:        0$' || die "low still held after remove up"
ms remove low
[ "$(ms ls)" = "No devices found" ] || die "devices left: $(ms ls)"
echo "$0: ok"
