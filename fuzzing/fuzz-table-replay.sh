#!/usr/bin/env bash
# Replay the table-parser corpus through the fuzz harness (no crash, every
# refusal has a message); under the sanitizer build this is an ASan run.
set -e
srcdir=${top_srcdir:-$(dirname "$0")/..}/fuzzing
exec ./fuzz-table "$srcdir"/corpus-table/*
