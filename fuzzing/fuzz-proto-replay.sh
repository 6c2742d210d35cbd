#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Replay the control-protocol corpus through the decoder harness (no
# crash, every refusal has a message, accepted requests re-encode
# exactly); under the sanitizer build this is an ASan run.
set -e
srcdir=${top_srcdir:-$(dirname "$0")/..}/fuzzing
exec ./fuzz-proto "$srcdir"/corpus-proto/*
