#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The service integration, installed: make install DESTDIR=... puts the
# units, nbdmapper-setup, the plugin, nbdmsetup and the man pages where
# configure said (and nothing under /etc: the layout is made at first
# start); systemd-analyze verify accepts the installed units; and the
# commands of the installed units run for real, with only their paths
# moved under $tmpdir:
#   - nbdmapper.service: ExecStartPre (the layout and key), then ExecStart
#     (nbdkit forks once it listens, its pid file says so); nbdinfo and
#     nbdmsetup (with the key made) through its socket, a change saved in
#     tables/, then SIGTERM, as systemctl stop sends;
#   - nbdmapper.socket + nbdmapper-activated.service through
#     systemd-socket-activate (systemd's, no running systemd needed):
#     nothing runs until the first connection, then ExecStartPre and
#     nbdkit's own socket activation (LISTEN_FDS), serving the device the
#     first variant saved, with nbdmsetup and data I/O through it.
source "${top_srcdir:-$(dirname "$0")/..}/tests/functions.sh"
requires nbdkit --version
requires nbdinfo --version
requires nbdsh --version
requires make --version
: "${NBDMSETUP:=$top_builddir/client-tools/nbdmsetup/nbdmsetup}"
[ "$unitdir" != no ] || { echo "$0: configured without units: skipped"; exit 77; }
[ -n "$unitdir" ] && [ -n "$libexecdir_nbdmapper" ] && [ -n "$confdir" ] ||
    die "run from make check (unitdir, libexecdir_nbdmapper, confdir)"

# --- make install DESTDIR=... --------------------------------------------
D=$tmpdir/destdir
# A make of its own, not a job of the make running this test.
env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL \
    make -s -C "$top_builddir" install DESTDIR="$D" > "$tmpdir/install.log" 2>&1 ||
    { cat "$tmpdir/install.log"; die "make install DESTDIR=$D failed"; }
dirs=$(env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -s -C "$top_builddir" \
           --no-print-directory -f - print-dirs <<'MK'
include Makefile
print-dirs:
	@echo "$(bindir) $(mandir) $(plugindir)"
MK
) || die "cannot read the installation directories"
read -r bindir mandir plugindir <<< "$dirs"
for f in "$unitdir/nbdmapper.service" "$unitdir/nbdmapper-activated.service" \
         "$unitdir/nbdmapper.socket" "$mandir/man1/nbdkit-mapper-plugin.1" \
         "$mandir/man8/nbdmsetup.8"; do
    [ "$(stat -c %a "$D$f" 2>/dev/null)" = 644 ] || die "$f: not installed 0644"
done
for f in "$libexecdir_nbdmapper/nbdmapper-setup" "$bindir/nbdmsetup" \
         "$plugindir/nbdkit-mapper-plugin.so"; do
    [ -x "$D$f" ] && [ -f "$D$f" ] || die "$f: not installed, or not executable"
done
[ ! -e "$D/etc" ] || die "make install wrote under /etc: $(find "$D/etc")"
! grep -n '@[a-zA-Z_]*@' "$D$unitdir"/nbdmapper* "$D$libexecdir_nbdmapper/nbdmapper-setup" ||
    die "a placeholder was not substituted"
grep -qx "Environment=NBDMAPPER_CONF=$confdir" "$D$unitdir/nbdmapper.service" ||
    die "nbdmapper.service: not configured for $confdir"

# unit_line UNIT KEY: the value of KEY= in the installed UNIT.
unit_line () { sed -n "s/^$2=//p" "$D$unitdir/$1"; }
pre=$(unit_line nbdmapper.service ExecStartPre)
[ "${pre%% *}" = "$libexecdir_nbdmapper/nbdmapper-setup" ] ||
    die "ExecStartPre is not the installed nbdmapper-setup: $pre"
[ "$(unit_line nbdmapper-activated.service ExecStartPre)" = "$pre" ] ||
    die "the two services' ExecStartPre differ"
exe=$(unit_line nbdmapper.service ExecStart)
[ -x "${exe%% *}" ] || die "ExecStart: ${exe%% *} is not executable"
[ "$(unit_line nbdmapper.socket Service)" = nbdmapper-activated.service ] ||
    die "nbdmapper.socket does not start nbdmapper-activated.service"

# --- systemd-analyze verify ----------------------------------------------
# The installed units as they are but for nbdmapper-setup's path, which
# is under $D (verify checks that commands exist); their man pages are
# looked for in $D's too, with the system's after them.
if systemd-analyze --version > /dev/null 2>&1; then
    mkdir "$tmpdir/verify"
    for u in nbdmapper.service nbdmapper-activated.service nbdmapper.socket; do
        sed "s|$libexecdir_nbdmapper/|$D$libexecdir_nbdmapper/|" \
            "$D$unitdir/$u" > "$tmpdir/verify/$u"
    done
    MANPATH="$D$mandir:" SYSTEMD_LOG_LEVEL=notice \
        systemd-analyze verify --man=yes "$tmpdir"/verify/nbdmapper.service \
        "$tmpdir"/verify/nbdmapper-activated.service \
        "$tmpdir"/verify/nbdmapper.socket > "$tmpdir/verify.log" 2>&1 ||
        { cat "$tmpdir/verify.log"; die "systemd-analyze verify refused the units"; }
    [ ! -s "$tmpdir/verify.log" ] ||
        { cat "$tmpdir/verify.log"; die "systemd-analyze verify warned"; }
    echo "systemd-analyze verify: the installed units are accepted"
else
    echo "$0: no systemd-analyze: units not verified"
fi

# --- the commands, for real ------------------------------------------------
conf=$tmpdir/conf
run=$tmpdir/run
mkdir "$run"                    # RuntimeDirectory=nbdmapper
# cmd_of UNIT KEY: KEY's command line, its paths under $tmpdir and $D,
# the plugin this build's (with the sanitizer's runtime, if any).
cmd_of ()
{
    local line words=() w
    line=$(unit_line "$1" "$2")
    line=${line//'${NBDMAPPER_CONF}'/$conf}
    line=${line//\/run\/nbdmapper\//$run/}
    line=${line//$libexecdir_nbdmapper\//$D$libexecdir_nbdmapper/}
    read -ra words <<< "$line"
    _cmd=()
    for w in "${words[@]}"; do
        if [ "$w" = mapper ]; then w=$PLUGIN; fi
        _cmd+=("$w")
    done
    if [ "${_cmd[0]##*/}" = nbdkit ] && [ "${#plugin_env[@]}" -gt 0 ]; then
        _cmd=(env "${plugin_env[@]}" "${_cmd[@]}")
    fi
}
cleanup_fn 'stop_pidfile "$run/nbdmapper.pid" KILL 2>/dev/null || :'

cmd_of nbdmapper.service ExecStartPre
"${_cmd[@]}" || die "ExecStartPre failed"
[ "$(stat -c %a "$conf/control.key")" = 600 ] || die "no 0600 key"
cmd_of nbdmapper.service ExecStart
"${_cmd[@]}" || die "ExecStart failed: ${_cmd[*]}"
# Type=forking: the pid file is there once nbdkit listens.
wait_file "$run/nbdmapper.pid"
[ -S "$run/nbdmapper.sock" ] || die "no socket at $run/nbdmapper.sock"
pid=$(cat "$run/nbdmapper.pid")
export NBDMSETUP_URI="nbd+unix:///control?socket=$run/nbdmapper.sock"
export NBDMSETUP_KEY=$conf/control.key
img=$(realpath "$(mkfile vol.img 1M)")
"$NBDMSETUP" create vol --table "0 2048 linear $img 0"
[ "$("$NBDMSETUP" ls)" = vol ] || die "ls: $("$NBDMSETUP" ls)"
[ "$(cat "$conf/tables/vol.table")" = "0 2048 linear $img 0" ] ||
    die "vol not saved in tables/"
nbdinfo --list "nbd+unix:///?socket=$run/nbdmapper.sock" | grep -q 'export="vol"' ||
    die "nbdinfo --list does not list vol"
nbdsh -u "nbd+unix:///vol?socket=$run/nbdmapper.sock" -c '
h.pwrite(b"written by the service" * 100, 4096)
h.flush()' || die "write through nbdmapper.service"
# Without the key, the control export refuses.
! NBDMSETUP_KEY= "$NBDMSETUP" ls 2> "$tmpdir/nokey.err" || die "ls without the key"
kill -TERM "$pid"
wait_for sh -c "! kill -0 $pid" || die "nbdkit did not stop on SIGTERM"

# The socket-activated variant, on the same configuration.
sock=$(unit_line nbdmapper.socket ListenStream)
[ "$sock" = /run/nbdmapper/nbdmapper.sock ] || die "ListenStream=$sock"
sock=${sock//\/run\/nbdmapper\//$run/}
rm -f "$sock"
cmd_of nbdmapper-activated.service ExecStartPre
pre=("${_cmd[@]}")
cmd_of nbdmapper-activated.service ExecStart
case " ${_cmd[*]} " in
    *" --unix "*|*" -U "*|*" --port "*|*" -p "*) die "the activated service listens itself";;
esac
if systemd-socket-activate --version > /dev/null 2>&1; then
    # As systemd: ExecStartPre, and only if it succeeds ExecStart, which
    # exec keeps at the pid that systemd-socket-activate's LISTEN_PID
    # names.
    systemd-socket-activate -l "$sock" -- bash -c \
        "$(printf '%q ' "${pre[@]}") && exec $(printf '%q ' "${_cmd[@]}")" \
        2> "$tmpdir/activate.log" &
    pid=$!
    cleanup_fn "kill -KILL $pid 2>/dev/null || :"
    wait_for test -S "$sock" || die "systemd-socket-activate does not listen"
    # Nothing but the listener before the first connection.
    [ "$(readlink "/proc/$pid/exe")" = "$(command -v systemd-socket-activate)" ] ||
        die "started before any connection: $(readlink "/proc/$pid/exe")"
    export NBDMSETUP_URI="nbd+unix:///control?socket=$sock"
    [ "$("$NBDMSETUP" ls)" = vol ] || die "activated: ls: $("$NBDMSETUP" ls)"
    [ "$(readlink "/proc/$pid/exe")" = "$(readlink -f "$(command -v nbdkit)")" ] ||
        die "not nbdkit after the first connection: $(readlink "/proc/$pid/exe")"
    grep -q '^LISTEN_FDS=1$' <(tr '\0' '\n' < "/proc/$pid/environ") ||
        die "nbdkit was not given the socket (LISTEN_FDS)"
    nbdsh -u "nbd+unix:///vol?socket=$sock" -c '
assert h.pread(2200, 4096) == b"written by the service" * 100' ||
        die "activated: the data written through nbdmapper.service"
    "$NBDMSETUP" info vol | grep -q '^State: *ACTIVE$' || die "activated: info"
    [ "$(nbdinfo --size "nbd+unix:///vol?socket=$sock")" = 1048576 ] ||
        die "activated: size"
    kill -TERM "$pid"
    wait_for sh -c "! kill -0 $pid" || die "activated nbdkit did not stop"
    wait "$pid" || :
    cat "$tmpdir/activate.log"
else
    echo "$0: no systemd-socket-activate: socket activation not run"
fi
echo "test-systemd-units: OK"
