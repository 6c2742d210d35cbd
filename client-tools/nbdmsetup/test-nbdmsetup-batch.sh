#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdmsetup batch: many commands over one control connection.  Lines run
# in order; the first failing line stops the batch, its message names the
# line, and nothing after it runs.  Bad lines change nothing.
source "$(dirname "$0")/functions-ms.sh"

a=$(mkfile a.img 1M)
mkdir "$tmpdir/tables"
start_server ctl mapper tables="$tmpdir/tables"
ms create d1 --table "0 2048 linear $a 0"
echo "0 1024 linear $a 0
1024 1024 linear $a 1024" > "$tmpdir/two.table"

# Several commands, one connection: tables, quoting, comments, options
# after the command, per-line options reset.
out=$(ms batch <<EOF2
# a comment, then a blank line

replace d1 $tmpdir/two.table
table d1
create 'd 2' --table "0 8 zero"    # trailing comment
suspend --noflush d1
resume d1
table 'd 2'
status d1
EOF2
) || die "batch failed"
expect="0 1024 linear $a 0
1024 1024 linear $a 1024
0 8 zero
0 1024 linear
1024 1024 linear"
[ "$out" = "$expect" ] || die "batch output:
$out
expected:
$expect"
[ "$(ms ls | sort)" = "d 2
d1" ] || die "ls after batch: $(ms ls)"

# A line's options end with the line: neither --inactive nor --json leaks
# into the next line.
ms load d1 --table "0 8 zero"
out=$(ms batch <<EOF2
table --inactive --json d1
table d1
EOF2
) || die "batch with per-line options failed"
expect='{"devices": [{"name": "d1", "table": ["0 8 zero"]}]}
0 1024 linear '"$a"' 0
1024 1024 linear '"$a"' 1024'
[ "$out" = "$expect" ] || die "per-line options leaked:
$out
expected:
$expect"
ms clear d1

# The same batch from a file; --json given once applies to every line.
echo "info d1" > "$tmpdir/b1"
echo "table d1" >> "$tmpdir/b1"
ms --json batch "$tmpdir/b1" > "$tmpdir/out.json" || die "batch FILE"
/usr/bin/python3 -c '
import json, sys
lines = open(sys.argv[1]).read().splitlines()
assert len(lines) == 2, lines
assert json.loads(lines[0])["devices"][0]["name"] == "d1", lines[0]
assert json.loads(lines[1])["devices"][0]["table"][1].startswith("1024 1024"), lines[1]
' "$tmpdir/out.json" || die "batch --json output: $(cat "$tmpdir/out.json")"

# A batch from a file may take a table from standard input.
echo "load d1 -" > "$tmpdir/b2"
ms batch "$tmpdir/b2" <<< "0 8 zero" || die "batch FILE with a table on stdin"
[ "$(ms table --inactive d1)" = "0 8 zero" ] ||
    die "table from stdin in a batch file: $(ms table --inactive d1)"
ms clear d1

# The first bad line stops the batch and is named; earlier lines ran,
# later ones did not.
snapshot () { { ms ls; ms table; ms info; } 2>&1; }
before=$(snapshot)
fails 'stdin:2: replace: no such device: nodev' ms batch <<EOF2
table d1
replace nodev $tmpdir/two.table
remove d1
EOF2
[ "$(snapshot)" = "$before" ] || die "a failed batch changed state"
fails 'stdin:1: unknown command .frobnicate.' ms batch <<< "frobnicate d1"
fails 'stdin:3: replace d1:1:' ms batch <<EOF2
ls

replace d1 --table "0 999999 linear $a 0"
remove --force d1
EOF2
[ "$(snapshot)" = "$before" ] || die "a bad table in a batch changed state"
fails 'stdin:1: -a: give it on the command line' ms batch <<< "ls -a x"
fails 'stdin:1: --connect: give it on the command line' \
    ms batch <<< "ls --connect x"
fails "stdin:1: '--bogus': unknown option" ms batch <<< "ls --bogus"
fails "stdin:1: '--uuid': missing value \\(see nbdmsetup --help\\)$" \
    ms batch <<< "create x --uuid"
fails "stdin:1: -x: unknown option \\(see nbdmsetup --help\\)$" \
    ms batch <<< "ls -xf"
fails "stdin:1: -x: unknown option" ms batch <<< "ls -fx"
fails 'stdin:1: unterminated " quote' ms batch <<< 'create "x'
fails 'stdin:1: table: wrong number of arguments' ms batch <<< "table a b"
fails 'stdin:1: batch: not a command of a batch' ms batch <<< "batch"
# The longest line (a command and 4096 words), and one word more.
fails 'stdin:1: ls: wrong number of arguments' \
    ms batch <<< "ls $(printf 'x %.0s' $(seq 4096))"
fails 'stdin:1: too many words \(at most 4097\)' \
    ms batch <<< "ls $(printf 'x %.0s' $(seq 4097))"
fails 'stdin:1: replace: give the table as a file' ms batch <<< "replace d1"
fails 'stdin:1: create: give the table as a file' ms batch <<< "create x -"
fails 'stdin:2: reload: give the table as a file' ms batch <<EOF2
ls
reload d1 -
remove --force d1
EOF2
fails "$tmpdir/nofile: No such file" ms batch "$tmpdir/nofile"
fails 'stdin:2: no command' ms batch <<< $'ls\n--noflush --json'
# A long batch file name is named whole.
long=$tmpdir/a-directory-with-a-rather-long-name-for-batch-files
mkdir "$long"
printf 'ls\nfrobnicate\n' > "$long/commands.txt"
fails "$long/commands.txt:2: unknown command" ms batch "$long/commands.txt"
fails 'fd/[0-9]+:1: nofile: No such file' \
    ms batch <(echo "replace d1 nofile")
[ "$(snapshot)" = "$before" ] || die "bad batch lines changed state"

echo "$0: ok"
