# SPDX-License-Identifier: BSD-3-Clause
# Sourced by the nbdmsetup tests: tests/functions.sh plus the control
# export of the server the tests start (start_server ctl mapper ...:
# $sock) and helpers to run nbdmsetup.
: "${top_srcdir:=$(cd "$(dirname "$0")/../.." && pwd)}"
: "${top_builddir:=$top_srcdir}"
source "$top_srcdir/tests/functions.sh"
: "${NBDMSETUP:=$top_builddir/client-tools/nbdmsetup/nbdmsetup}"
export NBDMSETUP

requires nbdkit --version
requires test -x "$NBDMSETUP"

sock=$tmpdir/ctl.sock
export NBDMSETUP_URI="nbd+unix:///control?socket=$sock"
unset NBDMSETUP_KEY

ms () { "$NBDMSETUP" "$@"; }

# stacked_pair: a server (tables=$tmpdir/t) with "low", a linear device
# over a.img, and "up" stacked on it.
stacked_pair ()
{
    local a
    a=$(mkfile a.img 1M)
    mkdir "$tmpdir/t"
    start_server ctl mapper tables="$tmpdir/t"
    ms create low --table "0 2048 linear $a 0"
    ms create up --table "0 2048 linear mapper:low 0"
}

# fails PATTERN CMD...: CMD must exit 1 with a "nbdmsetup: " message
# matching PATTERN (grep -E).
fails ()
{
    local pat=$1 rc=0
    shift
    "$@" > "$tmpdir/fails.out" 2> "$tmpdir/fails.err" || rc=$?
    [ "$rc" -eq 1 ] || { cat "$tmpdir/fails.err"; die "$*: exit $rc, expected 1"; }
    grep -q '^nbdmsetup: ' "$tmpdir/fails.err" ||
        die "$*: no 'nbdmsetup:' message: $(cat "$tmpdir/fails.err")"
    grep -Eq -- "$pat" "$tmpdir/fails.err" ||
        die "$*: message '$(cat "$tmpdir/fails.err")' does not match /$pat/"
    echo "refused as expected: $(cat "$tmpdir/fails.err")"
}

# steady CMD...: CMD's output once it has stayed the same for 0.5 s (at
# most 10 s): a client's connection threads and fds go a little after it
# disconnects, so a count read at once may still include them.
steady ()
{
    local v last n=0 i
    last=$("$@")
    for (( i = 0; i < 100 && n < 5; i++ )); do
        sleep 0.1
        v=$("$@")
        if [ "$v" = "$last" ]; then n=$((n + 1)); else n=0 last=$v; fi
    done
    echo "$last"
}

# until_busy WHAT DEV PATTERN PID OUT: PID, a command run in the
# background (its output in OUT), waits for something the test holds;
# return once a change to DEV is refused as busy (a message matching
# PATTERN, grep), at most after 10 s.  The probe, a rename of DEV to
# itself, changes nothing until then ("already exists").  Each probe is
# bounded: a control export blocked by the wait fails the test (as every
# command hung before the waits were made without its lock), as does
# PID ending before it was seen waiting.
until_busy ()
{
    local what=$1 dev=$2 pat=$3 pid=$4 out=$5 i rc
    for (( i = 0; ; i++ )); do
        rc=0
        timeout 10 "$NBDMSETUP" rename "$dev" "$dev" > "$tmpdir/busy" 2>&1 || rc=$?
        [ "$rc" -ne 124 ] ||
            die "$what: rename $dev hangs: the control export is blocked"
        grep -q "$pat" "$tmpdir/busy" && return 0
        grep -q "already exists" "$tmpdir/busy" ||
            die "$what: rename $dev $dev: $(cat "$tmpdir/busy")"
        kill -0 "$pid" 2>/dev/null ||
            die "$what did not wait: $(cat "$out")"
        [ "$i" -lt 100 ] ||
            die "$what: rename $dev never refused as busy: $(cat "$tmpdir/busy")"
        sleep 0.1
    done
}

# ev NAME: the device's event number.
ev () { ms info "$1" | sed -n 's/^Event number: *//p'; }

# thin_pool MD_SIZE DATA_SIZE LOW_WATER [FEATURE...]: the thin tests' pool:
# files $md and $data of those sizes, a server (log in $tmpdir/log, its
# tables in $tmpdir/tables) and on it device "pool", a thin-pool of
# 64 KiB blocks over all of $data, with thin volume 1 created in it.
thin_pool ()
{
    local low=$3 features=
    md=$(mkfile md.img "$1")
    data=$(mkfile data.img "$2")
    mkdir -p "$tmpdir/tables"
    start_server --stderr "$tmpdir/log" ctl -f mapper tables="$tmpdir/tables"
    shift 3
    [ $# -eq 0 ] || features=" $# $*"
    ms create pool --table "0 $(( $(stat -c %s "$data") / 512 )) thin-pool $md $data 128 $low$features"
    ms message pool 0 create_thin 1
}

# ext4_fill MIB: mkfs.ext4 on $loop (fuse_attach's), mounted on
# $tmpdir/mnt, with a file "big" of MIB MiB and 50 small files in d/.
ext4_fill ()
{
    mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 "$loop"
    mount -t ext4 "$loop" "$tmpdir/mnt"
    dd if=/dev/urandom of="$tmpdir/mnt/big" bs=1M count="$1" status=none
    mkdir "$tmpdir/mnt/d"
    local i
    for i in $(seq 50); do
        head -c $((i * 1337)) /dev/urandom > "$tmpdir/mnt/d/f$i"
    done
    sync
}

# ext4_writers NFILES [SYNC_EVERY]: writers on $tmpdir/mnt (files
# load0..load{NFILES-1} rewritten in turn, each SYNC_EVERY-th synced)
# until $tmpdir/stop exists; $load is their pid, and $tmpdir/writes
# their count once they stopped.
ext4_writers ()
{
    cat > "$tmpdir/load.sh" <<'EOS'
i=0
while [ ! -e "$1/stop" ]; do
    head -c $(( (i % 7 + 1) * 40000 )) /dev/urandom > "$1/mnt/load$((i % $2))"
    [ "$3" -eq 0 ] || [ $((i % $3)) -ne 0 ] || sync "$1/mnt/load$((i % $2))"
    i=$((i + 1))
done
echo "$i" > "$1/writes"
EOS
    bash "$tmpdir/load.sh" "$tmpdir" "$1" "${2:-0}" & load=$!
}

# clone_hydrated NAME REGIONS: wait (at most 60 s) until the clone target
# of NAME shows REGIONS/REGIONS hydrated; fail the test otherwise.
clone_hydrated ()
{
    local i
    for (( i = 0; i < 600; i++ )); do
        ms status "$1" | grep -q " $2/$2 " && return 0
        sleep 0.1
    done
    die "$1: not hydrated: $(ms status "$1")"
}

# file_sh SCRIPT FILE [PRE [FLUSH]]: write SCRIPT, an nbdkit sh plugin
# script serving FILE (parallel, writable, flushable) for a remote
# backend that misbehaves on cue: PRE runs first for every method ($1;
# it may exit 1 to fail it), FLUSH is the flush method's body.
file_sh ()
{
    cat > "$1" <<EOF
#!/bin/bash
${3:-:}
case "\$1" in
    thread_model) echo parallel ;;
    get_size) stat -L -c %s '$2' ;;
    can_write|can_flush) exit 0 ;;
    pread) dd if='$2' skip=\$4 count=\$3 iflag=skip_bytes,count_bytes status=none ;;
    pwrite) dd of='$2' seek=\$4 oflag=seek_bytes conv=notrunc status=none ;;
    flush) ${4:-:} ;;
    *) exit 2 ;;
esac
EOF
    chmod +x "$1"
}
