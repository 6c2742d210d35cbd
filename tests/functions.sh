# SPDX-License-Identifier: BSD-3-Clause
# Sourced by every shell test.  Run from automake (tests/Makefile.am sets
# top_srcdir, top_builddir, PLUGIN) or by hand from the build tree.
set -e
set -u

# nbdsh runs "python3 -m nbd": only Debian's python3 has the module.
PATH=/usr/bin:/usr/sbin:/bin:/sbin:$PATH
export PATH

: "${top_srcdir:=$(cd "$(dirname "$0")/.." && pwd)}"
: "${top_builddir:=$top_srcdir}"
# The tests' Python parts share tests/nbdcheck.py.  No __pycache__ in
# the source tree (it may be read-only, and is not the build's).
export PYTHONPATH="$top_srcdir/tests${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONDONTWRITEBYTECODE=1
: "${PLUGIN:=$top_builddir/plugins/mapper/.libs/nbdkit-mapper-plugin.so}"
: "${SANITIZER_LIBASAN:=}"

# requires CMD [ARGS...]: skip the test (exit 77) unless CMD ARGS succeeds.
requires ()
{
    if ! "$@" >/dev/null 2>&1; then
        echo "$0: skipped: requires $*"
        exit 77
    fi
}

# A scratch directory removed at exit; cleanup_fn CMD... adds cleanups
# (run in reverse order, before the directory goes).
_cleanups=()
cleanup_fn () { _cleanups+=("$*"); }
_stop_failed=
_run_cleanups ()
{
    local status=$?
    local i
    for (( i=${#_cleanups[@]}-1; i>=0; i-- )); do
        eval "${_cleanups[$i]}" || :
    done
    # What the cleanups left running fails the test, skipped or passed:
    # it would outlive the test (a server whose pid file a restart had
    # overwritten), holding its port, files and CPU.
    if ! _leak_check; then
        [ "$status" -ne 0 ] && [ "$status" -ne 77 ] || status=1
    fi
    # NBDMAPPER_KEEP_FAILED=1: a failed test leaves its scratch dir (and
    # says where), for the evidence of a failure seen once in a while.
    if [ "$status" -ne 0 ] && [ -n "${NBDMAPPER_KEEP_FAILED:-}" ]; then
        echo "$0: kept $tmpdir" >&2
    else
        rm -rf "$tmpdir"
    fi
    # A server that had to be killed (stop_pidfile) fails the test, even
    # when it was stopped by a cleanup after everything else passed.
    if [ "$status" -eq 0 ] && [ -n "$_stop_failed" ]; then
        status=1
    fi
    exit $status
}

# _test_procs: the processes of this test, but for its shell: the shell's
# descendants, and any process whose command line, working directory or
# open files name $tmpdir (a daemonised server has init as its parent, and
# its pid file, socket or image there): in _procs, "PID WHY" each.  Other tests'
# processes name their own scratch directories (mktemp's names are
# unique), a loop device or a FUSE mount being detached is the kernel's
# (no process), and this scan's only processes are one find, run from /,
# whose command line names $tmpdir but which reads no command lines:
# about 30 ms.
_test_procs ()
{
    local -A why=()
    local todo=("$$") p f kids k out args
    # Descendants (Linux's /proc/PID/task/TID/children).
    while [ "${#todo[@]}" -gt 0 ]; do
        p=${todo[-1]}; unset 'todo[-1]'
        for f in /proc/"$p"/task/*/children; do
            kids=()
            read -ra kids 2>/dev/null < "$f" || :
            for k in ${kids[@]+"${kids[@]}"}; do
                why[$k]+=" child"; todo+=("$k")
            done
        done
    done
    out=$(cd / && exec find /proc/[0-9]*/cwd /proc/[0-9]*/fd -maxdepth 1 \
                     -lname "$tmpdir*" 2>/dev/null) || :
    while IFS=/ read -r _ _ p f; do
        [ -z "$p" ] || why[$p]+=" $f"
    done <<< "$out"
    for f in /proc/[0-9]*/cmdline; do
        mapfile -d '' args 2>/dev/null < "$f" || continue
        [[ ${args[*]-} != *"$tmpdir"* ]] || {
            p=${f#/proc/}; why[${p%/cmdline}]+=" command-line"; }
    done
    unset 'why[$$]'
    _procs=()
    for p in "${!why[@]}"; do
        ! _running "$p" || _procs+=("$p${why[$p]}")
    done
}
# _running PID: it runs (not gone, not a zombie: a zombie has closed its
# files and sockets, and its parent reaps it).
_running ()
{
    local st
    read -r st 2>/dev/null < "/proc/$1/stat" || return 1
    st=${st##*) }
    [ "${st:0:1}" != Z ]
}
# _leak_check: fails (and says so) if any of the test's processes
# (_test_procs) is still running after its cleanups: each is named
# (pid, why it is the test's, command line), then sent SIGTERM, and
# SIGKILL if still there after _stop_wait s.  One that is going already
# (a cleanup signalled it without waiting) has 2 s to go.
_leak_check ()
{
    local p args
    _test_procs
    ! _await_gone 20 || return 0
    for p in "${_procs[@]}"; do
        args=()
        mapfile -d '' args 2>/dev/null < "/proc/${p%% *}/cmdline" || :
        echo "$0: FAIL: pid ${p%% *} still running at the end of the test" \
             "(${p#* }): ${args[*]-}" >&2
        kill -TERM "${p%% *}" 2>/dev/null || :
    done
    ! _await_gone $((_stop_wait * 10)) || return 1
    for p in "${_procs[@]}"; do
        echo "$0: FAIL: pid ${p%% *} did not exit within $_stop_wait s of" \
             "SIGTERM: killed with SIGKILL" >&2
        kill -KILL "${p%% *}" 2>/dev/null || :
    done
    return 1
}
# _await_gone TENTHS: keeps in _procs ("PID WHY" each) those still
# running, waiting up to TENTHS tenths of a second for them to go; true
# once none is left.
_await_gone ()
{
    local i p left
    for (( i = 0; ; i++ )); do
        left=()
        for p in ${_procs[@]+"${_procs[@]}"}; do
            ! _running "${p%% *}" || left+=("$p")
        done
        _procs=(${left[@]+"${left[@]}"})
        [ "${#_procs[@]}" -gt 0 ] || return 0
        [ "$i" -lt "$1" ] || return 1
        sleep 0.1
    done
}
tmpdir=$(mktemp -d "${TMPDIR:-/tmp}/nbdmapper-test.XXXXXX")
# For unit-run.sh: what names it is the test's, should the test be killed.
[ -z "${NBDMAPPER_SCRATCH_LOG:-}" ] ||
    echo "$tmpdir" >> "$NBDMAPPER_SCRATCH_LOG" 2>/dev/null || :
# A signal exits with 128+N, which runs the cleanups once (as the EXIT
# trap) and fails the test: trapping INT and TERM with _run_cleanups too
# ran them twice and exited with the last command's status, often 0.
trap _run_cleanups EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --- servers ----------------------------------------------------------------
# Every nbdkit a test runs starts here, in one of two ways:
#
#   mapper [HARNESS-OPTS] NBDKIT-OPTS... PLUGIN-ARGS...
#       nbdkit with the freshly built plugin for the length of the call:
#       with --run CMD, in the foreground (-f), or expected to refuse to
#       start (and --help, --dump-plugin...).  Its exit status is
#       nbdkit's.  E.g.  mapper -U - "$tmpdir/a.table" --run 'nbdinfo "$uri"'
#   start_server [HARNESS-OPTS] NAME NBDKIT-ARGS...
#       a server that outlives the call: nbdkit NBDKIT-ARGS, daemonised
#       (or with -f, in the background), listening on $tmpdir/NAME.sock
#       unless NBDKIT-ARGS say where (-U, -p...), its pid in
#       $tmpdir/NAME.pid.  The plugin is named, as on nbdkit's command
#       line: "mapper" is the freshly built plugin, anything else
#       (memory, file, --filter=delay null...) one of nbdkit's.  Returns
#       once it serves; a server that cannot start fails the test.  At
#       exit stop_server NAME stops it, if nothing did before: servers
#       running our plugin first (they are the clients of the others),
#       each kind in the reverse order of their starts.
#   stop_server NAME [SIGNAL]
#       stop it (SIGTERM unless told) and wait until it is gone.  A
#       server still there 10 s after SIGTERM hangs at exit: it is killed
#       with SIGKILL and the test fails (stop_server returns 1, and a
#       test whose cleanup had to kill a server exits 1).
#
# HARNESS-OPTS, before the rest:
#   --timeout SECS   kill nbdkit after SECS and fail the test: for servers
#                    expected to refuse to start, so that one that hangs
#                    instead ends the test rather than stalling it.
#   --wrap 'CMD'     run nbdkit under CMD (words split at blanks), e.g.
#                    'ip netns exec NS', 'strace -f -o FILE'.
#   --stderr FILE    (start_server) nbdkit's stderr to FILE (its -v log;
#                    a daemonised nbdkit logs to syslog without -v),
#                    shown when it fails to start.
#
# Our plugin runs with plugin_env (below); nbdkit's other plugins, the
# wrapper and the commands of --run do not.

# The environment of nbdkit running our plugin, set up here only.  Under
# a sanitizer build the plugin is instrumented but nbdkit is not, so the
# sanitizer runtime is preloaded (SANITIZER_LIBASAN: a colon-separated
# list, see configure.ac); leaks are not reported (most would be
# nbdkit's) and a report exits 99.  Python programs that start nbdkit get
# the same from NBDMAPPER_PLUGIN_ENV, one VAR=VALUE a line
# (nbdcheck.mapper_command; nbdcheck.mapper_run runs such a server in
# the foreground and checks its exit status).
plugin_env=()
if [ -n "$SANITIZER_LIBASAN" ]; then
    plugin_env=(LD_PRELOAD="$SANITIZER_LIBASAN"
                ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=0:abort_on_error=0:exitcode=99}"
                UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:exitcode=99}")
fi
NBDMAPPER_PLUGIN_ENV=
[ "${#plugin_env[@]}" -eq 0 ] ||
    NBDMAPPER_PLUGIN_ENV=$(printf '%s\n' "${plugin_env[@]}")
export NBDMAPPER_PLUGIN_ENV

# nbdkit's options that take a value as the next word.
_nbdkit_opt_arg='-U|-t|-p|-P|-e|-D|-i|--filter|--tls|--tls-psk|--tls-certificates|--log|--exportname|--selinux-label|--user|--group|--mask-handshake|--threads|--unix|--port|--pidfile|--ipaddr|--run'

# _server_cmd NBDKIT-ARGS...: the command line for nbdkit NBDKIT-ARGS
# in _cmd, under _wrap, with _preopts (if set) first.  Sets _fg
# (foreground: -f or --run), _listen (the arguments say where it
# listens), _pidfile (-P's), _run (--run given) and _mine (the plugin is
# ours).  As for nbdkit, the plugin is the first word that is neither an
# option nor an option's value.  The plugin word "mapper" becomes $PLUGIN
# with plugin_env, and the command of --run then starts without it
# (qemu-img, python and fio are not built for the sanitizer runtime).
_server_cmd ()
{
    local args=() plugin=false a i
    _fg=false _listen=false _pidfile= _run=false _mine=false
    while [ $# -gt 0 ]; do
        a=$1; shift
        if [[ $a != -* ]]; then
            if ! $plugin && [ "$a" = mapper ]; then _mine=true; a=$PLUGIN; fi
            plugin=true
            args+=("$a")
            continue
        fi
        case "$a" in
            -U|--unix|--unix=*|-p|--port|--port=*|-s|--single|--vsock)
                _listen=true ;;
            -P|--pidfile) _pidfile=$1 ;;
            --pidfile=*) _pidfile=${a#*=} ;;
            -f|--foreground|-[!-]*f*) _fg=true ;;
            --run) _fg=true _run=true ;;
        esac
        args+=("$a")
        # An option's value is the next word (and not the plugin).
        if [[ $a =~ ^($_nbdkit_opt_arg)$ ]] && [ $# -gt 0 ]; then
            args+=("$1"); shift
        fi
    done
    if $_mine && [ "${#plugin_env[@]}" -gt 0 ]; then
        for (( i = 0; i < ${#args[@]} - 1; i++ )); do
            if [ "${args[i]}" = --run ]; then
                i=$((i + 1))
                args[i]="unset LD_PRELOAD ASAN_OPTIONS UBSAN_OPTIONS; ${args[i]}"
            fi
        done
        _cmd=("${_wrap[@]}" env "${plugin_env[@]}")
    else
        _cmd=("${_wrap[@]}")
    fi
    _cmd+=(nbdkit "${_preopts[@]}" "${args[@]}")
}

# _harness_opts ARGS...: reads HARNESS-OPTS into _timeout, _wrap and
# _stderr (and empties _preopts); sets _shift to how many words they took.
_harness_opts ()
{
    _timeout= _wrap=() _preopts=() _stderr= _shift=0
    while [ $# -gt 0 ]; do
        case "$1" in
            --timeout) _timeout=$2 ;;
            --stderr) _stderr=$2 ;;
            --wrap) read -ra _wrap <<< "$2" ;;
            *) return 0 ;;
        esac
        shift 2; _shift=$((_shift + 2))
    done
}

mapper ()
{
    local opts=() rc=0 runpid= runerr= teepid= errfd pid i
    _harness_opts "$@"; shift "$_shift"
    # The plugin goes after the leading options.
    while [ $# -gt 0 ] && [[ $1 == -* ]]; do
        opts+=("$1"); shift
        if [[ ${opts[-1]} =~ ^($_nbdkit_opt_arg)$ ]] && [ $# -gt 0 ]; then
            opts+=("$1"); shift
        fi
    done
    _server_cmd "${opts[@]}" mapper "$@"
    case " ${opts[*]} " in
        *" --help "*|*" --dump-plugin "*|*" --version "*) _fg=true ;;
    esac
    $_fg || die "mapper $*: a server that outlives the call (no --run," \
                "no -f) is started with start_server"
    # Under a sanitizer, --run's server is a process of nbdkit's that no
    # one waits for: its exit status (99 after a report) is lost, and its
    # report may come after nbdkit has returned.  Its pid file says which
    # process it is: once it is gone, a report on its stderr (which goes
    # through to ours as well) fails the test.
    if $_run && $_mine && [ "${#plugin_env[@]}" -gt 0 ]; then
        runerr=$tmpdir/mapper-run.err
        if [ -z "$_pidfile" ]; then
            runpid=$tmpdir/mapper-run.pid
            _preopts=(-P "$runpid")
            _server_cmd "${opts[@]}" mapper "$@"
        else
            runpid=$_pidfile
        fi
        rm -f "$runpid"
        : > "$runerr"
        exec {errfd}> >(tee -a "$runerr" >&2)
        teepid=$!
    else
        exec {errfd}>&2
    fi
    if [ -n "$_timeout" ]; then
        timeout -k 5 "$_timeout" "${_cmd[@]}" 2>&"$errfd" || rc=$?
        if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
            echo "$0: FAIL: nbdkit mapper $* did not exit within" \
                 "$_timeout s: killed" >&2
            _stop_failed=1
        fi
    else
        "${_cmd[@]}" 2>&"$errfd" || rc=$?
    fi
    exec {errfd}>&-
    if [ -n "$runerr" ]; then
        if [ -s "$runpid" ]; then
            pid=$(cat "$runpid")
            for (( i = 0; i < 100; i++ )); do
                kill -0 "$pid" 2>/dev/null || break
                sleep 0.1
            done
        fi
        # tee ends once no process (a server, a command's leftover) holds
        # the pipe.
        for (( i = 0; i < 50; i++ )); do
            kill -0 "$teepid" 2>/dev/null || break
            sleep 0.1
        done
        if grep -Eq '==[0-9]+==ERROR: [A-Za-z]+Sanitizer|runtime error:' \
                "$runerr"; then
            echo "$0: FAIL: nbdkit mapper $*: a sanitizer report (above)" \
                 "from the server of --run" >&2
            _stop_failed=1
            [ "$rc" -ne 0 ] || rc=99
        fi
    fi
    return "$rc"
}

start_server ()
{
    local name rc=0 i
    _harness_opts "$@"; shift "$_shift"
    name=$1; shift
    [ -z "$_timeout" ] || die "start_server $name: --timeout is for mapper"
    # Its pid file is start_server's, and where it listens unless told:
    # a first pass reads what the arguments say.
    _server_cmd "$@"
    ! $_run || die "start_server $name: --run: use mapper"
    [ -z "$_pidfile" ] || die "start_server $name: its pid file is" \
                              "$tmpdir/$name.pid, not -P $_pidfile"
    rm -f "$tmpdir/$name.pid" "$tmpdir/$name.job"
    _preopts=(-P "$tmpdir/$name.pid")
    if ! $_listen; then
        rm -f "$tmpdir/$name.sock"
        _preopts+=(-U "$tmpdir/$name.sock")
    fi
    _server_cmd "$@"
    # Under a sanitizer, ours run in the foreground, detached from the
    # test's shell (a bare "wait" in a test does not wait for them): a
    # daemonised nbdkit has no stderr for a report, and its exit status
    # (99 after one) is seen by no one.  The exit status goes to
    # $tmpdir/NAME.exit, which stop_server reads: a report fails the test.
    local detach=false
    if $_mine && ! $_fg && [ "${#plugin_env[@]}" -gt 0 ]; then
        _preopts+=(-f)
        _server_cmd "$@"
        detach=true
    fi
    rm -f "$tmpdir/$name.exit" "$tmpdir/$name.detached"
    ! $detach || : > "$tmpdir/$name.detached"
    _started "$name" "$_mine"
    local err
    if [ -n "$_stderr" ]; then exec {err}> "$_stderr"; else exec {err}>&2; fi
    if $detach; then
        ( ( st=0; "${_cmd[@]}" 2>&"$err" || st=$?
            echo "$st" > "$tmpdir/$name.exit" ) & )
    elif $_fg; then
        "${_cmd[@]}" 2>&"$err" &
        echo $! > "$tmpdir/$name.job"
    else
        "${_cmd[@]}" 2>&"$err" || rc=$?
        [ "$rc" -eq 0 ] ||
            _start_failed "$name" "nbdkit exited $rc: ${_cmd[*]}"
    fi
    exec {err}>&-
    # A daemonised nbdkit writes its pid file after the parent has exited,
    # and after it listens: wait for it (and in the foreground, give up as
    # soon as nbdkit is gone).
    for (( i = 0; i < 300; i++ )); do
        [ -s "$tmpdir/$name.pid" ] && return 0
        if $_fg && ! kill -0 "$(cat "$tmpdir/$name.job")" 2>/dev/null; then
            _start_failed "$name" "nbdkit exited before it served: ${_cmd[*]}"
        fi
        if [ -e "$tmpdir/$name.exit" ]; then
            _start_failed "$name" "nbdkit exited $(cat "$tmpdir/$name.exit")" \
                          "before it served: ${_cmd[*]}"
        fi
        sleep 0.1
    done
    _start_failed "$name" "no pid file after 30 s: ${_cmd[*]}"
}
_start_failed ()
{
    [ -z "$_stderr" ] || tail -n 40 "$_stderr" >&2
    die "start_server $1: $2"
}

# mapper_refuses [HARNESS-OPTS] PATTERN ARGS...: nbdkit with our plugin
# and ARGS (as for mapper) must refuse to start: exit 1 within 30 s,
# before its --run command could run, with a message matching PATTERN
# (grep -E).  Its output is printed, and left in $tmpdir/refused.out.
mapper_refuses ()
{
    local opts=() pat rc=0
    while [ "${1:-}" = --wrap ]; do opts+=("$1" "$2"); shift 2; done
    pat=$1; shift
    rm -f "$tmpdir/refused.ran"
    # A Unix socket in the scratch dir rather than -U -: nbdkit 1.32 leaks
    # its /tmp/nbdkitXXXXXX directory when it fails during configuration.
    mapper --timeout 30 "${opts[@]}" -U "$tmpdir/refused.sock" "$@" \
           --run "touch '$tmpdir/refused.ran'" > "$tmpdir/refused.out" 2>&1 ||
        rc=$?
    cat "$tmpdir/refused.out"
    [ "$rc" -eq 1 ] || die "nbdkit mapper $*: exit $rc, not 1 (a refusal)"
    [ ! -e "$tmpdir/refused.ran" ] || die "nbdkit mapper $*: it started"
    grep -Eq -- "$pat" "$tmpdir/refused.out" ||
        die "nbdkit mapper $*: no message matching /$pat/"
}

# _started NAME MINE: NAME is a server to stop at exit (MINE: it runs our
# plugin).  The cleanup is registered at the first start: what a test
# sets up later (an nbdfuse mount on a server) goes before the servers,
# what it set up before (a network namespace) after.
_servers=()
declare -A _server_mine=()
_started ()
{
    local i
    [ "${#_servers[@]}" -gt 0 ] || cleanup_fn _stop_servers
    for i in "${!_servers[@]}"; do
        [ "${_servers[i]}" != "$1" ] || unset '_servers[i]'
    done
    _servers=("${_servers[@]}" "$1")
    _server_mine[$1]=$2
}
_stop_servers ()
{
    local i mine
    for mine in true false; do
        for (( i = ${#_servers[@]} - 1; i >= 0; i-- )); do
            [ "${_server_mine[${_servers[i]}]}" != "$mine" ] ||
                stop_server "${_servers[i]}" || :
        done
    done
}

stop_server ()
{
    local rc=0
    stop_pidfile "$tmpdir/$1.pid" "${2:-TERM}" || rc=$?
    # One in the foreground is this shell's child: reap it (and let a
    # wrapper such as strace finish).
    if [ -s "$tmpdir/$1.job" ]; then
        wait "$(cat "$tmpdir/$1.job")" 2>/dev/null || :
        rm -f "$tmpdir/$1.job"
    fi
    # Detached (start_server, under a sanitizer): its exit status follows
    # the process's end at once.
    local i st=
    if [ -e "$tmpdir/$1.detached" ]; then
        for (( i = 0; i < 50; i++ )); do
            st=$(cat "$tmpdir/$1.exit" 2>/dev/null) && [ -n "$st" ] && break
            sleep 0.1
        done
        rm -f "$tmpdir/$1.exit" "$tmpdir/$1.detached"
    fi
    if [ "$st" = 99 ]; then
        echo "$0: FAIL: server $1 exited 99: a sanitizer report" \
             "(above, on its stderr)" >&2
        _stop_failed=1
        rc=1
    fi
    rm -f "$tmpdir/$1.sock"
    return "$rc"
}

# start_qemu_nbd NAME IMAGE: qemu-nbd serving the raw IMAGE (8 clients)
# on $tmpdir/NAME.sock, pid in $tmpdir/NAME.pid: stopped by stop_server
# NAME, as start_server's.
start_qemu_nbd ()
{
    rm -f "$tmpdir/$1.sock" "$tmpdir/$1.pid"
    qemu-nbd -f raw -t --shared=8 -k "$tmpdir/$1.sock" \
        --pid-file="$tmpdir/$1.pid" "$2" &
    _started "$1" false
    wait_for test -s "$tmpdir/$1.pid" || die "qemu-nbd $1 did not start"
}

# kill_job PID [SIGNAL]: signal PID (SIGTERM unless told) if it is still
# a running background job of this shell, for cleanups.  A plain "kill
# $pid" of a job that has ended (waited for, or reaped by the shell)
# signals whatever process got the number since: under load pids wrap
# around here every few seconds (pid_max 32768), and test-mirror-log.sh's
# cleanup sent SIGKILL to the pid of a writer it had waited for.
kill_job ()
{
    jobs -rp | grep -qx "$1" || return 0
    kill "-${2:-TERM}" "$1" 2>/dev/null || :
}

# mkfile NAME SIZE: a sparse backing file in the scratch dir; prints its path.
mkfile ()
{
    truncate -s "$2" "$tmpdir/$1"
    echo "$tmpdir/$1"
}

# die MSG: fail the test with a message.
die () { echo "$0: FAIL: $*" >&2; exit 1; }

# --- generic helpers added for the shell tests ----------------------------

# fill_random FILE SIZE [SEED]: (over)write FILE with SIZE deterministic
# pseudo-random bytes (the same SEED always gives the same bytes).
fill_random ()
{
    python3 - "$1" "$2" "${3:-1}" <<'PYEOF'
import random, sys
path, size, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(seed)
with open(path, "wb") as f:
    left = size
    while left > 0:
        n = min(left, 1 << 20)
        f.write(rng.randbytes(n))
        left -= n
PYEOF
}

# wait_for CMD...: retry CMD every 0.1s for up to 30s; fail if it never
# succeeds.
wait_for ()
{
    local i
    for (( i=0; i<300; i++ )); do
        if "$@" >/dev/null 2>&1; then return 0; fi
        sleep 0.1
    done
    echo "$0: timed out waiting for: $*" >&2
    return 1
}

# wait_file FILE: until FILE is there and not empty (a pid file).
wait_file () { wait_for test -s "$1" || die "timed out waiting for $1"; }

# backend_status SERVER: `nbdmsetup status --backends` of mapper SERVER
# into $tmpdir/status.out; false if it fails.
backend_status ()
{
    "${NBDMSETUP:-$top_builddir/client-tools/nbdmsetup/nbdmsetup}" \
        -a "nbd+unix:///control?socket=$tmpdir/$1.sock" \
        status --backends > "$tmpdir/status.out"
}
# conns_up_now SERVER DEVICE N/M: mapper SERVER's status says "N/M
# connections up"; if not, a read of DEVICE (a request wakes the
# reconnects), and false.
conns_up_now ()
{
    backend_status "$1" && grep -q "$3 connections up" "$tmpdir/status.out" &&
        return 0
    timeout 60 nbdsh -u "nbd+unix:///$2?socket=$tmpdir/$1.sock" \
        -c 'h.pread(512, 0)' >/dev/null 2>&1
    return 1
}
# wait_conns_up SERVER DEVICE N/M: until conns_up_now, or die.
wait_conns_up ()
{
    wait_for conns_up_now "$@" ||
        { cat "$tmpdir/status.out"; die "$1: not $3 connections up"; }
}

# free_port: a TCP port on 127.0.0.1 that nothing listens on right now.
free_port ()
{
    python3 -c 'import socket
s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# netns_skip WHAT CMD...: skip (77) with the reason if CMD fails.
netns_skip ()
{
    local what=$1; shift
    if ! "$@" > "$tmpdir/netns.err" 2>&1; then
        echo "$0: skipped: cannot $what: $(head -1 "$tmpdir/netns.err")"
        exit 77
    fi
}

# netns_new NAME: a network namespace with its loopback up, deleted at
# exit; skips (77) where namespaces cannot be made or entered.
netns_new ()
{
    netns_skip "create a network namespace" ip netns add "$1"
    cleanup_fn "ip netns delete '$1'"
    netns_skip "run a command in a network namespace" ip netns exec "$1" true
    ip -n "$1" link set lo up
}

# netns_veth NSA NSB ADDR_A ADDR_B: two namespaces (netns_new) joined by
# a veth pair, va in NSA with ADDR_A/30 and vb in NSB with ADDR_B/30,
# both up; skips (77) where a veth pair cannot be made.
netns_veth ()
{
    netns_new "$1"
    netns_new "$2"
    netns_skip "create a veth pair" \
        ip -n "$1" link add va type veth peer name vb netns "$2"
    ip -n "$1" addr add "$3/30" dev va
    ip -n "$2" addr add "$4/30" dev vb
    ip -n "$1" link set va up
    ip -n "$2" link set vb up
}

# stop_pidfile PIDFILE [SIGNAL]: stop_server's work: stop the server whose
# pid is in PIDFILE (SIGTERM unless told) and remove the file; wait until
# it is gone (or a zombie: a daemon's parent is init, which may be slow to
# reap it, and a zombie has closed its sockets and files).  A server
# still there after 10 s hangs at exit: it is killed with SIGKILL, and
# the test fails (stop_pidfile returns 1, and a test whose cleanup had to
# kill a server exits 1).  Does nothing without a pid file.  (The 10 s is
# _stop_wait, for test-harness.sh.)
_stop_wait=10
stop_pidfile ()
{
    local pid i threads
    [ -s "$1" ] || return 0
    pid=$(cat "$1")
    rm -f "$1"
    kill "-${2:-TERM}" "$pid" 2>/dev/null || return 0
    for (( i = 0; i < _stop_wait * 10; i++ )); do
        kill -0 "$pid" 2>/dev/null || return 0
        [ "$(cut -d' ' -f3 "/proc/$pid/stat" 2>/dev/null)" != Z ] || return 0
        sleep 0.1
    done
    # What it was and where its threads wait, for the report.
    threads=$(for t in /proc/$pid/task/*; do
                  printf ' %s(%s)' "$(cat "$t/comm")" "$(cat "$t/wchan")"
              done 2>/dev/null)
    echo "$0: FAIL: pid $pid ($1) did not exit within $_stop_wait s of" \
         "SIG${2:-TERM}: killed with SIGKILL." \
         "Command: $(tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null)" \
         "Threads:$threads" >&2
    # Where exactly: a hang seen once in a hundred runs is otherwise lost.
    if command -v gdb > /dev/null; then
        echo "$0: the stacks of pid $pid:" >&2
        timeout 60 gdb -p "$pid" -batch -nx -ex 'thread apply all bt' \
            < /dev/null 2>/dev/null | grep -E '^(Thread|#)' | head -300 >&2 || :
    fi
    kill -9 "$pid" 2>/dev/null || :
    _stop_failed=1
    return 1
}

# private_mounts: re-run this test (from the start, as "$BASH" "$0") in
# a mount namespace of its own, so that what it mounts (nbdfuse, ext4 on
# a loop device) is in no other namespace.  A namespace made meanwhile by
# anyone else ("ip netns exec" in another suite's netns tests, unshare
# -m) starts as a copy of every mount of the moment, and here mounts are
# private (no propagation): our umount then leaves that copy mounted, and
# the filesystem stays alive there until that namespace ends, its last
# writes and its superblock not on the device, with the loop device and
# the FUSE mount held.  fsck then finds wrong free counts, and a fresh
# server reads files as they were before the last writes: test-ext4.sh's
# failures under load.  In the new namespace, the copies of other tests'
# mounts are dropped, so as not to hold theirs in turn.  Call it before
# any cleanup_fn.  Where a mount namespace cannot be made it does nothing
# (ext4_umount still catches a filesystem held elsewhere).
private_mounts ()
{
    local m
    if [ "${_NBDMAPPER_MOUNT_NS:-}" != "$$" ]; then
        unshare -m --propagation private true 2>/dev/null || return 0
        [ "${#_cleanups[@]}" -eq 0 ] ||
            die "private_mounts: called after a cleanup_fn"
        trap - EXIT
        rm -rf "$tmpdir"
        # NBDMAPPER_OUTER_MNT_NS: the namespace the test started in, where
        # other tests make their copies (test-ext4-mount-ns.sh makes one).
        exec {m}</proc/self/ns/mnt
        NBDMAPPER_OUTER_MNT_NS=/proc/$$/fd/$m _NBDMAPPER_MOUNT_NS=$$ \
            exec unshare -m --propagation private "$BASH" "$0"
    fi
    for m in $(awk '$5 ~ /\/nbdmapper-test\./ { print $5 }' /proc/self/mountinfo |
                   grep -vF "$tmpdir" | sort -r); do
        umount -l "$m" 2>/dev/null || :
    done
}

# ext4_umount DIR: umount the ext4 filesystem mounted on DIR, and fail
# the test, naming who holds it, if it is still mounted somewhere (in
# another mount namespace, see private_mounts): it would stay alive with
# its last writes not on the device.
ext4_umount ()
{
    local dev pids p
    dev=$(findmnt -n -o SOURCE --mountpoint "$1") ||
        die "ext4_umount $1: nothing mounted there"
    umount "$1"
    [ -e "/sys/fs/ext4/${dev##*/}" ] || return 0
    pids=$(grep -l -e " $dev " /proc/[0-9]*/mountinfo 2>/dev/null |
               cut -d/ -f3 | tr '\n' ' ')
    pids=${pids% }
    for p in $pids; do
        echo "$0: pid $p ($(tr '\0' ' ' < "/proc/$p/cmdline" 2>/dev/null))" \
             "mounts $dev in mount namespace $(readlink "/proc/$p/ns/mnt")" >&2
    done
    die "umount $1: the ext4 on $dev is still mounted elsewhere" \
        "(pids: ${pids:-none found}): its last writes are not on the device"
}

# ext4_fuse_preflight: skip the test (exit 77) unless an ext4 filesystem
# on nbdfuse + a loop device can work here at all, independent of the
# plugin (containers often cannot): the tools, a loop device on a file with
# ext4 mounted from it, and (given nbdkit's memory plugin) an nbdfuse mount.
# Then the test runs in a mount namespace of its own (private_mounts):
# call it first, before any cleanup_fn.
ext4_fuse_preflight ()
{
    local preloop pf
    private_mounts
    requires nbdfuse --version
    requires fusermount3 --version
    requires test -c /dev/fuse
    requires losetup --version
    requires mkfs.ext4 -V
    requires fsck.ext4 -V
    requires mount --version
    requires sha256sum --version
    truncate -s 8M "$tmpdir/pre.img"
    mkfs.ext4 -q -F "$tmpdir/pre.img" >/dev/null 2>&1 || {
        echo "$0: skipped: mkfs.ext4 on a file fails"; exit 77; }
    mkdir "$tmpdir/pre"
    if ! preloop=$(loop_attach "$tmpdir/pre.img" 2> "$tmpdir/pre.err"); then
        echo "$0: skipped: cannot attach a loop device: $(cat "$tmpdir/pre.err")"
        exit 77
    fi
    if ! mount -t ext4 "$preloop" "$tmpdir/pre" 2>/dev/null; then
        losetup -d "$preloop"
        echo "$0: skipped: cannot mount ext4"; exit 77
    fi
    umount "$tmpdir/pre"
    losetup -d "$preloop"
    nbdkit memory --dump-plugin >/dev/null 2>&1 || return 0
    mkdir "$tmpdir/prefuse"
    pf=$tmpdir/prefuse
    if ! nbdkit -U - memory 1M --run "
            nbdfuse '$pf' \"\$uri\" & pid=\$!
            for i in \$(seq 100); do
                [ -e '$pf/nbd' ] && break; sleep 0.1
            done
            ok=0; [ -e '$pf/nbd' ] && ok=1
            fusermount3 -u '$pf' 2>/dev/null || kill \$pid 2>/dev/null
            wait \$pid 2>/dev/null
            [ \$ok = 1 ]" >/dev/null 2>&1; then
        grep -q " $pf " /proc/mounts &&
            { fusermount3 -u -z "$pf" || umount -l "$pf"; }
        echo "$0: skipped: nbdfuse cannot mount here"; exit 77
    fi
}

# loop_attach [LOSETUP-OPTS...] FILE: attach FILE to a free loop device
# (losetup -f --show LOSETUP-OPTS FILE) and print the device.  The
# machine has few loop device nodes (8 made at boot), and parallel suites'
# ext4 tests share them: losetup -f asks /dev/loop-control for a free one,
# which the kernel makes when none is (and devtmpfs its node).  Where it
# cannot (no /dev/loop-control, max_loop reached, a static /dev without
# the node), or when another attach took the one it found first, losetup
# fails ("cannot find an unused loop device", or "/dev/loopN: failed to
# set up loop device").  Then loop_attach says so once and waits for one
# to come free, up to NBDMAPPER_LOOP_WAIT s (default 120); after that it
# fails naming the devices and what holds them (losetup -a).  Any other
# error (the file's) fails at once, with losetup's message.  test-ext4.sh
# copies it (declare -f) into its phases' scripts.
loop_attach ()
{
    local wait=${NBDMAPPER_LOOP_WAIT:-120} i out dev said=
    for (( i = 0; ; i++ )); do
        if out=$(losetup -f --show "$@" 2>&1); then
            # --show's line (a warning may come with it).
            dev=$(printf '%s\n' "$out" | grep -m 1 '^/dev/')
            [ -z "$said" ] || echo "loop_attach $*: got $dev" >&2
            echo "$dev"
            return 0
        fi
        case "$out" in
            *"unused loop device"*|*"/dev/loop"[0-9]*": failed to set up loop device"*) ;;
            *) echo "loop_attach $*: $out" >&2; return 1 ;;
        esac
        if [ "$i" -ge $(( wait * 2 )) ]; then
            echo "loop_attach $*: FAIL: no free loop device within $wait s" \
                 "(NBDMAPPER_LOOP_WAIT): $out." \
                 "Loop devices: $(echo /dev/loop[0-9]*)." \
                 "/dev/loop-control: $( [ -w /dev/loop-control ] &&
                                        echo writable || echo absent)." \
                 "In use (losetup -a):" >&2
            losetup -a >&2 || :
            return 1
        fi
        if [ -z "$said" ]; then
            echo "loop_attach $*: no free loop device ($out): waiting" \
                 "up to $wait s for one" >&2
            said=1
        fi
        sleep 0.5
    done
}

# fuse_attach URI: nbdfuse URI on $tmpdir/fuse (made by the caller) and a
# fresh loop device on its file (no blocks cached from before); sets $loop
# to the device and writes $tmpdir/{fusepid,loopdev} for fuse_detach.
# Fails if nbdfuse does not come up within 30 s (the caller says so).
fuse_attach ()
{
    nbdfuse "$tmpdir/fuse" "$1" &
    echo $! > "$tmpdir/fusepid"
    wait_for test -e "$tmpdir/fuse/nbd" || return 1
    loop=$(loop_attach "$tmpdir/fuse/nbd") || return 1
    echo "$loop" > "$tmpdir/loopdev"
}

# fuse_detach: undo an nbdfuse + losetup + mount stack set up in
# $tmpdir/{fuse,mnt,loopdev,fusepid}, in reverse order; safe to run more
# than once or when only part was set up, and never hangs on a dead FUSE
# mount.
fuse_detach ()
{
    if mountpoint -q "$tmpdir/mnt" 2>/dev/null; then
        umount "$tmpdir/mnt" 2>/dev/null || umount -l "$tmpdir/mnt" || :
    fi
    if [ -s "$tmpdir/loopdev" ]; then
        losetup -d "$(cat "$tmpdir/loopdev")" 2>/dev/null || :
        rm -f "$tmpdir/loopdev"
    fi
    if grep -q " $tmpdir/fuse " /proc/mounts 2>/dev/null; then
        fusermount3 -u "$tmpdir/fuse" 2>/dev/null ||
            fusermount3 -u -z "$tmpdir/fuse" 2>/dev/null ||
            umount -l "$tmpdir/fuse" 2>/dev/null || :
    fi
    # Gone before the test's end (the harness fails a test that leaves
    # processes), killed if it hangs (which fails the test).  Only
    # builtins: test-ext4.sh copies this function (declare -f) into the
    # scripts of its phases.
    local pid i st
    if [ -s "$tmpdir/fusepid" ]; then
        pid=$(< "$tmpdir/fusepid")
        rm -f "$tmpdir/fusepid"
        kill "$pid" 2>/dev/null || :
        for (( i = 0; i < 100; i++ )); do
            kill -0 "$pid" 2>/dev/null || return 0
            # A zombie has let go of its mount and device.
            read -r st 2>/dev/null < "/proc/$pid/stat" || return 0
            st=${st##*) }
            [ "${st:0:1}" != Z ] || return 0
            sleep 0.1
        done
        echo "$0: FAIL: nbdfuse pid $pid did not exit within 10 s of" \
             "SIGTERM: killed with SIGKILL" >&2
        kill -9 "$pid" 2>/dev/null || :
        _stop_failed=1
    fi
}
