#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The control export at the wire level (ctlproto.py, from PROTOCOL.md):
# truncated, oversized, garbage, wrong-version, junk-trailing messages,
# FLUSH without a request, reads past the response, replayed and
# reordered sequence numbers.  Each is refused with a status and a
# message, and nothing changes.
source "$(dirname "$0")/functions-ms.sh"
requires python3 -c 'import nbd'

start_server ctl mapper tables="$(mkdir "$tmpdir/t" && echo "$tmpdir/t")"
ms create d1 --table "0 8 zero"
before=$(ms table; ls "$tmpdir/t")

python3 "$top_srcdir/client-tools/nbdmsetup/proto_raw.py" "$NBDMSETUP_URI"
[ "$(ms table; ls "$tmpdir/t")" = "$before" ] || die "state changed"
echo "$0: ok"
