#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Replay the table-parser corpus through the fuzz harness (no crash, every
# refusal has a message); under the sanitizer build this is an ASan run.
set -e
srcdir=${top_srcdir:-$(dirname "$0")/..}/fuzzing
exec ./fuzz-table "$srcdir"/corpus-table/*
