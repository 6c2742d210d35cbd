#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# nbdmsetup.bash, sourced in this bash: each completion as bash runs it
# (COMP_WORDS, COMP_CWORD, then COMPREPLY): commands (the same list as
# nbdmsetup's), options of each command, field lists, files, and from a
# live server the device names (quoted), uuids and target types, with
# the URI from $NBDMSETUP_URI or -a on the line; nothing and no error
# without a server.
source "$(dirname "$0")/functions-ms.sh"

src=$top_srcdir/client-tools/nbdmsetup
source "$src/nbdmsetup.bash"
complete -p nbdmsetup | grep -q -- '-F _nbdmsetup nbdmsetup$' ||
    die "not registered: $(complete -p nbdmsetup)"

# comp WORD...: the completions of the last word, one a line, sorted.
comp ()
{
    COMP_WORDS=("$NBDMSETUP" "$@")
    COMP_CWORD=$#
    COMPREPLY=()
    _nbdmsetup
    [ "${#COMPREPLY[@]}" -eq 0 ] || printf '%s\n' "${COMPREPLY[@]}" | sort
}
# is WANT WORD...: comp WORD... gives the lines of WANT (sorted).
is ()
{
    local want=$1 got
    shift
    got=$(comp "$@")
    [ "$got" = "$(printf '%s' "$want" | sort)" ] ||
        die "completing '$*': got
$got
expected
$want"
}

# Commands: those nbdmsetup runs (verbs[] of nbdmsetup.c, and batch).
mine=$(echo $_nbdmsetup_verbs | tr ' ' '\n' | sort)
theirs=$({ grep -oE '^ +(LOCAL_)?VERB \("[^"]+"' "$src/nbdmsetup.c" |
           sed 's/.*"\(.*\)"/\1/'; echo batch; } | sort)
[ "$mine" = "$theirs" ] || die "commands differ from nbdmsetup.c's:
$(diff <(echo "$mine") <(echo "$theirs"))"
is "$theirs" ""
is "reload
remove
remove_all
rename
replace
resume" re
is "deps" --json de
is "info" -a x -k y inf

# Options: the global ones and the command's own.
is "--noheadings" info --nohead
is "--target
--timeout
--tree" ls --t
is "--readonly" create x --read
is "--clear" stats --cle
is "--prometheus" stats --prom
is "--region" stats d1 --reg
is "-r" create x -r
is "--resume" move x --res
is "--region-size" move x --region-
is "clone" move --method cl
is "core" move x --log co
comp table - | grep -qx -- --showkeys || die "table -: no --showkeys"
comp table - | grep -qx -- --json || die "table -: no --json"
! comp table - | grep -qx -- --force || die "table -: --force"
is "" remove -- -

# Values: field lists (the last element of a comma-separated list), tree
# options, files.
is "name,segments" info -c -o name,se
is "-devs_used" info -c -O -devs_
is "ascii" ls --tree -o as
is "devname" deps -o dev
echo "0 8 zero" > "$tmpdir/tab.table"
is "$tmpdir/tab.table" load d1 "$tmpdir/ta"
is "$tmpdir/tab.table" create d1 "$tmpdir/ta"
is "$tmpdir/tab.table" batch "$tmpdir/ta"
is "$tmpdir/tab.table" move d1 "$tmpdir/ta"          # DEST: a file
is "$tmpdir/tab.table" move --metadata "$tmpdir/ta"
is "" create ""
is "" -a ""

# No server: nothing, at once, without a word.
is "" info ""
NBDMSETUP_URI="nbd+unix:///control?socket=$tmpdir/nosock" comp info "" \
    2> "$tmpdir/err" > "$tmpdir/out"
[ ! -s "$tmpdir/out" ] && [ ! -s "$tmpdir/err" ] || die "no server: $(cat "$tmpdir/out" "$tmpdir/err")"

# A live server: names, uuids and target types from it.
start_server ctl mapper table="$tmpdir/tab.table"
ms create d1 --table "0 8 zero" --uuid U-1
ms create "sp ace" --table "0 8 zero"
ms create e2 -n
is 'd1
e2
sp\ ace
tab' info ""
is "d1" remove -f d
is "d1" move --resume d
is 'sp\ ace' table s
is "U-1" info -u U
is "linear" ls --target li
is "striped" target-version st
is "" create ""
is "" wait d1 ""
# The URI from -a (or --connect) on the line, not only from the environment.
uri=$NBDMSETUP_URI
unset NBDMSETUP_URI
is "" status ""
is "d1" -a "$uri" status d
is "d1" --connect "'$uri'" status d
is "d1" --connect="$uri" deps d
echo "$0: ok"
