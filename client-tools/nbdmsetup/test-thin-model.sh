#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# A random workload on a thin pool through the server (tests/thin_model.py):
# writes of many sizes (some FUA), write zeroes, discards, flushes,
# snapshots of snapshots, deletes and new volumes, checked byte for byte
# through every volume against a model, with each volume's mapped blocks
# and the pool's used data blocks.  Then the server stops and the real
# tools judge the metadata: thin_check clean, thin_dump shows exactly the
# model's devices and mappings.  A restart serves the same bytes (the
# metadata is read back from the file).
source "$(dirname "$0")/functions-ms.sh"
requires nbdsh --version
requires thin_check -V
requires thin_dump -V

thin_pool 8M 64M 16 error_if_no_space

model=$top_srcdir/tests/thin_model.py
python3 "$model" run "$sock" pool 65536 2097152 "${SEED:-14}" 600 \
        "$tmpdir/model.json" || { tail -20 "$tmpdir/log"; die "workload"; }
ms status

stop_server ctl
thin_check "$md" || die "thin_check after the workload"
thin_dump "$md" > "$tmpdir/dump.xml" || die "thin_dump"
python3 "$model" check-dump "$tmpdir/model.json" "$tmpdir/dump.xml" ||
    { head -30 "$tmpdir/dump.xml"; die "thin_dump does not match the model"; }

# The same bytes after a restart.
start_server --stderr "$tmpdir/log2" ctl -f mapper tables="$tmpdir/tables"
python3 "$model" verify "$sock" pool 65536 2097152 0 0 "$tmpdir/model.json" ||
    { tail -20 "$tmpdir/log2"; die "volumes differ after a restart"; }
stop_server ctl
thin_check "$md" || die "thin_check after the restart"
echo "$0: ok"
