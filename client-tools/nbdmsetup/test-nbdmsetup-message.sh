#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Target messages through nbdmsetup against a live server:
#   - crypt's dm-crypt "key wipe" and "key set <key>": refused on a running
#     device, resume refused after a wipe until a key is set, every bad key
#     refused naming why with nothing changed, data written before a wipe
#     reads back after setting the same key and differently with another,
#     a new key saved in tables=DIR (a restart uses it), and no key in the
#     server's -v log or in any nbdmsetup output but table --showkeys;
#   - flakey's "intervals <up> <down>" and delay's "delay <ms>..." (ours):
#     the I/O changes as they say, the table shows and saves them, bad forms
#     are refused with the table unchanged.
source "$(dirname "$0")/functions-ms.sh"
requires nbdsh --version
requires cmp --version

c=$(realpath "$(mkfile c.img 4M)")
f=$(realpath "$(mkfile f.img 1M)")
d=$(realpath "$(mkfile d.img 1M)")
fill_random "$f" 1048576 5
fill_random "$d" 1048576 6
k1=$(python3 -c 'import os; print(os.urandom(64).hex())')
k2=$(python3 -c 'import os; print(os.urandom(64).hex())')
z128=$(printf '0%.0s' {1..128})
dir=$tmpdir/tables
mkdir "$dir"
echo "0 8192 crypt aes-xts-plain64 $k1 0 $c 0" > "$dir/c1.table"
echo "0 2048 flakey $f 0 3600 0" > "$dir/f1.table"
echo "0 2048 delay $d 0 0" > "$dir/d1.table"
echo "0 2048 delay $d 0 0 $d 0 0" > "$dir/d2.table"
log=$tmpdir/server.log
start_server --stderr "$log" ctl -v mapper tables="$dir"

# Every nbdmsetup's stderr is kept, to look for keys in it.
ms ()
{
    local rc=0
    "$NBDMSETUP" "$@" 2> "$tmpdir/ms1.err" || rc=$?
    cat "$tmpdir/ms1.err" >> "$tmpdir/ms.err"
    cat "$tmpdir/ms1.err" >&2
    return "$rc"
}
uri () { echo "nbd+unix:///$1?socket=$sock"; }
state () { ms info "$1" | sed -n 's/^State: *//p'; }

# refused PATTERN DEV CMD...: CMD fails as `fails` checks, with one line
# on stderr and nothing on stdout, and DEV's live table (with keys) and
# state are what they were.
refused ()
{
    local pat=$1 dev=$2 before st
    shift 2
    before=$(ms table --showkeys "$dev")
    st=$(state "$dev")
    fails "$pat" "$@"
    [ "$(wc -l < "$tmpdir/fails.err")" -eq 1 ] ||
        die "$*: not one line: $(cat "$tmpdir/fails.err")"
    [ ! -s "$tmpdir/fails.out" ] || die "$*: printed $(cat "$tmpdir/fails.out")"
    [ "$(ms table --showkeys "$dev")" = "$before" ] ||
        die "$*: changed the table of $dev: $(ms table "$dev")"
    [ "$(state "$dev")" = "$st" ] || die "$*: changed the state of $dev"
}

# --- crypt ---------------------------------------------------------------
fill_random "$tmpdir/plain" 1048576 7
# write_plain: the plaintext through c1 at offset 0; read_c1 OUT.
write_plain () {
    nbdsh -u "$(uri c1)" -c '
with open("'"$tmpdir/plain"'", "rb") as fp:
    h.pwrite(fp.read(), 0)
h.flush()' || die "write through c1"
}
read_c1 () {
    nbdsh -u "$(uri c1)" -c '
with open("'"$1"'", "wb") as fp:
    fp.write(h.pread(1048576, 0))' || die "read through c1"
}
write_plain
read_c1 "$tmpdir/r0"
cmp "$tmpdir/plain" "$tmpdir/r0" || die "c1 does not read back what it wrote"

# Only on a suspended device, as dm-crypt.
refused 'not suspended' c1 ms message c1 0 key wipe
refused 'not suspended' c1 ms message c1 0 key set "$k1"
ms suspend c1
# Bad keys with the key still there: refused, the key unchanged.
refused 'wrong size.*512 bits \(128 hex digits\)' c1 \
    ms message c1 0 key set "${k2:0:64}"
refused 'not hexadecimal' c1 ms message c1 0 key set "${k2:0:126}zz"
ms resume c1
[ "$(state c1)" = ACTIVE ] || die "c1 not resumed after refused key sets"
read_c1 "$tmpdir/r1"
cmp "$tmpdir/plain" "$tmpdir/r1" || die "a refused key set changed the key"

ms suspend c1
ms message c1 0 key wipe
[ "$(ms table --showkeys c1)" = "0 8192 crypt aes-xts-plain64 $z128 0 $c 0" ] ||
    die "key wipe: table shows $(ms table --showkeys c1)"
grep -q "$k1" "$dir/c1.table" || die "key wipe changed the saved table"
# No resume without a key, whether asked once or twice.
refused "resume: device 'c1': crypt target at sector 0: its key was wiped.*key set" \
    c1 ms resume c1
refused 'key was wiped' c1 ms resume c1
[ "$(state c1)" = SUSPENDED ] || die "c1 not suspended after refused resume"
# The device's state is what is wrong, not an argument: status 13 (wrong
# device state), as for a resume with nothing to resume; not 1 (invalid
# argument), which dm's EAGAIN came through as.
out=$(PYTHONPATH="$top_srcdir/client-tools/nbdmsetup:$PYTHONPATH" \
      python3 - "$NBDMSETUP_URI" <<'PY'
import sys
from ctlproto import Conn
s, text = Conn(sys.argv[1]).call("resume", "c1", seq=1)
print(s, text.decode().strip())
PY
)
[[ $out == "13 "*"key was wiped"* ]] ||
    die "resume after key wipe: status and message '$out', not 13 (wrong state)"
# Every bad form: exit 1, one line naming why, nothing changed.
refused 'wrong size' c1 ms message c1 0 key set "${k2:0:64}"
refused 'wrong size' c1 ms message c1 0 key set "${k2}00"
refused '127 hex digits is the wrong size' c1 \
    ms message c1 0 key set "${k2:0:127}"
refused 'not hexadecimal \(character 1\)' c1 \
    ms message c1 0 key set "x${k2:1}"
refused 'not supported here: no kernel keyring' c1 \
    ms message c1 0 key set :64:logon:cryptsetup:vol
refused "no key \('-'\)" c1 ms message c1 0 key set -
refused 'identical' c1 ms message c1 0 key set "${k2:0:64}${k2:0:64}"
refused 'expected one key, got 0' c1 ms message c1 0 key set
refused 'expected one key, got 2' c1 ms message c1 0 key set "$k1" "$k1"
refused 'key wipe: takes no argument' c1 ms message c1 0 key wipe now
refused "unrecognised message: crypt takes 'key set <key>' and 'key wipe'" \
    c1 ms message c1 0 key
refused 'unrecognised message' c1 ms message c1 0 keys wipe
refused 'unrecognised message' c1 ms message c1 0 hello
refused 'key was wiped' c1 ms resume c1
# The same key back: the data written before the wipe reads back.
ms message c1 0 KEY SET "$k1"
[ "$(ms table --showkeys c1)" = "0 8192 crypt aes-xts-plain64 $k1 0 $c 0" ] ||
    die "key set: table shows $(ms table --showkeys c1)"
ms resume c1
read_c1 "$tmpdir/r2"
cmp "$tmpdir/plain" "$tmpdir/r2" || die "same key set back: data differs"
# Another key: the same ciphertext reads as something else.
ms suspend c1
# Through stdin, as the man page suggests (no key on a command line).
echo "message c1 0 key set $k2" | ms batch
ms resume c1
read_c1 "$tmpdir/r3"
! cmp -s "$tmpdir/plain" "$tmpdir/r3" || die "another key read the same data"
# What runs is saved: a restart from tables=DIR uses the new key.
grep -q "$k2" "$dir/c1.table" || die "the new key is not saved"
! grep -q "$k1" "$dir/c1.table" || die "the old key is still saved"
[ "$(stat -c %a "$dir/c1.table")" = 600 ] || die "c1.table is not 0600"
fill_random "$tmpdir/plain" 1048576 8
write_plain

# Keys only where asked for: the table masks them, nbdmsetup's outputs and
# the server's log never hold them.
[ "$(ms table c1)" = "0 8192 crypt aes-xts-plain64 $z128 0 $c 0" ] ||
    die "table without --showkeys: $(ms table c1)"
stop_server ctl
for k in "$k1" "$k2"; do
    ! grep -q "$k" "$log" "$tmpdir/ms.err" ||
        die "a key is in the server's log or nbdmsetup's output"
done
grep -q 'control: message' "$log" || die "no -v log of the messages"
start_server --stderr "$log" ctl -v mapper tables="$dir"
read_c1 "$tmpdir/r4"
cmp "$tmpdir/plain" "$tmpdir/r4" || die "after a restart: data differs"

# A wiped table does not block a new one: resume swaps in the loaded
# table (its own key), as dm resumes the new map.
c2=$(realpath "$(mkfile c2.img 1M)")
ms create c2 --table "0 2048 crypt aes-xts-plain64 $k1 0 $c2 0"
ms suspend c2
ms message c2 0 key wipe
refused 'key was wiped' c2 ms resume c2
ms load c2 --table "0 2048 crypt aes-xts-plain64 $k2 0 $c2 0"
ms resume c2
[ "$(state c2)" = ACTIVE ] || die "c2: the loaded table did not resume"
[ "$(ms table --showkeys c2)" = "0 2048 crypt aes-xts-plain64 $k2 0 $c2 0" ] ||
    die "c2: $(ms table c2)"
# And replace, whose new table has its key, on a suspended wiped device.
ms suspend c2
ms message c2 0 key wipe
ms replace c2 --table "0 2048 crypt aes-xts-plain64 $k1 0 $c2 0"
[ "$(state c2)" = ACTIVE ] || die "c2: replace did not resume"

# --- flakey (ours) -------------------------------------------------------
read_f1 () {
    nbdsh -u "$(uri f1)" -c '
with open("'"$f"'", "rb") as fp:
    assert h.pread(65536, 0) == fp.read(65536)'
}
read_f1 || die "f1 up: read"
ms message f1 0 intervals 0 3600
[ "$(ms table f1)" = "0 2048 flakey $f 0 0 3600 2 error_reads error_writes" ] ||
    die "intervals: table shows $(ms table f1)"
grep -q "flakey $f 0 0 3600 2 error_reads error_writes" "$dir/f1.table" || die "intervals not saved"
! read_f1 2>/dev/null || die "f1 down (always): a read succeeded"
refused "unrecognised message 'interval': flakey takes 'intervals" f1 \
    ms message f1 0 interval 1 2
refused 'intervals: expected <up_interval> <down_interval>, got 1 argument$' \
    f1 ms message f1 0 intervals 1
refused 'got 3 arguments' f1 ms message f1 0 intervals 1 2 3
refused "intervals: invalid up interval 'x'" f1 ms message f1 0 intervals x 1
refused "intervals: invalid down interval '-1'" f1 \
    ms -- message f1 0 intervals 1 -1
refused 'intervals: total \(up \+ down\) interval is zero' f1 \
    ms message f1 0 intervals 0 0
refused 'intervals: interval overflow' f1 \
    ms message f1 0 intervals 4294967295 1
! read_f1 2>/dev/null || die "f1 up after refused messages"
ms message f1 0 intervals 3600 0
read_f1 || die "f1 up again: read"

# --- delay (ours) --------------------------------------------------------
refused "delay: this table gives 1 class of delay, so 1 number, got 2" d1 \
    ms message d1 0 delay 1 2
refused "delay: invalid delay 'x'" d1 ms message d1 0 delay x
refused "delay: invalid delay '4294967296'" d1 \
    ms message d1 0 delay 4294967296
refused "unrecognised message 'wait': delay takes 'delay <ms>'$" d1 \
    ms message d1 0 wait 1
refused "delay takes 'delay <ms> <write_ms>'$" d2 ms message d2 0 slow
refused "so 2 numbers, got 1" d2 ms message d2 0 delay 5
refused "delay: invalid write delay 'y'" d2 ms message d2 0 delay 5 y
ms message d2 0 delay 5 7
[ "$(ms table d2)" = "0 2048 delay $d 0 5 $d 0 7" ] ||
    die "d2: table shows $(ms table d2)"
grep -q "delay $d 0 5 $d 0 7" "$dir/d2.table" || die "d2's delays not saved"
# A read held by a ten-minute delay is let go when the delay goes back to
# 0: waiting requests measure their wait again.
ms message d1 0 delay 600000
[ "$(ms table d1)" = "0 2048 delay $d 0 600000" ] || die "d1: $(ms table d1)"
nbdsh -u "$(uri d1)" -c '
with open("'"$d"'", "rb") as fp:
    assert h.pread(4096, 0) == fp.read(4096)' &
reader=$!
wait_for sh -c "[ \"\$('$NBDMSETUP' status d1)\" = '0 2048 delay 1 0 0' ]" ||
    die "the read is not held: status $(ms status d1)"
ms message d1 0 delay 0
wait_for sh -c "! kill -0 $reader 2>/dev/null" ||
    die "the held read was not let go by delay 0"
wait "$reader" || die "the held read failed"
[ "$(ms status d1)" = "0 2048 delay 0 0 0" ] || die "status $(ms status d1)"
# Linear takes no message, still.
ms create l1 --table "0 64 linear $d 0"
fails 'does not accept messages' ms message l1 0 hello
echo "test-nbdmsetup-message: OK"
