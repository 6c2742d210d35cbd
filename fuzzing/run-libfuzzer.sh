#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Build both harnesses with clang's libFuzzer + ASan and run each for a
# bounded time (default 30 s each) starting from its seed corpus.  New
# inputs go to a scratch copy, not the checked-in corpus.
#   fuzzing/run-libfuzzer.sh [SECONDS]
set -euo pipefail
secs=${1:-30}
top=$(cd "$(dirname "$0")/.." && pwd)
command -v clang >/dev/null || { echo "$0: clang not found: skipped"; exit 77; }
# config.h from an in-tree configure or scripts/test's build-default.
cfg=
for d in "$top" "$top/build-default"; do
    [ -f "$d/config.h" ] && { cfg=$d; break; }
done
[ -n "$cfg" ] || { echo "$0: no config.h: run ./configure (or scripts/test) first"; exit 1; }
out=$(mktemp -d "${TMPDIR:-/tmp}/nbdmapper-fuzz.XXXXXX")
trap 'rm -rf "$out"' EXIT
flags="-g -O1 -fsanitize=fuzzer,address,undefined -DWITH_LIBFUZZER -I$cfg -I$top -I$top/server -I$top/proto"
clang $flags "$top/fuzzing/fuzz-proto.c" "$top/proto/proto.c" -lcrypto \
    -o "$out/fuzz-proto"
clang $flags -pthread "$top/fuzzing/fuzz-table.c" "$top"/server/*.c \
    "$top"/server/backends/*.c "$top"/server/targets/*.c -o "$out/fuzz-table"
for h in proto table; do
    mkdir "$out/corpus-$h"
    cp "$top/fuzzing/corpus-$h"/* "$out/corpus-$h/"
    echo "=== fuzz-$h for ${secs}s"
    "$out/fuzz-$h" -max_total_time="$secs" -max_len=65536 "$out/corpus-$h"
done
