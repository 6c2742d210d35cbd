# SPDX-License-Identifier: BSD-3-Clause
"""What the Python parts of the shell tests share (import nbdcheck;
tests/functions.sh puts this directory on PYTHONPATH)."""
import errno
import os
import signal
import subprocess
import time

import nbd


def connect(sock, name=""):
    """A libnbd handle on export NAME of the server at Unix socket SOCK."""
    h = nbd.NBD()
    h.connect_uri("nbd+unix:///%s?socket=%s" % (name, sock))
    return h


def fails_eio(f, *args):
    """f(*args): True if it failed with EIO, False if it worked; any other
    error fails the test."""
    try:
        f(*args)
    except nbd.Error as e:
        assert e.errnum == errno.EIO, e
        return True
    return False


def until(cond, what, seconds=60):
    """Wait until cond() is true (polled every 50 ms); fails the test,
    saying WHAT, after SECONDS."""
    deadline = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def aio_wait(h, cookie, seconds=60, what="an aio command did not complete"):
    """Wait for the aio command COOKIE on H: 0 if it worked, else its
    errno; fails the test after SECONDS."""
    deadline = time.monotonic() + seconds
    try:
        while not h.aio_command_completed(cookie):
            left = deadline - time.monotonic()
            assert left > 0, what
            h.poll(int(left * 1000) + 1)
    except nbd.Error as e:
        return e.errnum
    return 0


def when_back(f, *args, seconds=60, what="the device did not come back"):
    """f(*args) once it stops failing with EIO (a backend reconnecting);
    fails the test after SECONDS (a deadline: each failing call may
    itself take up to the mapper's remote-timeout)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return f(*args)
        except nbd.Error as e:
            assert e.errnum == errno.EIO, e
            assert time.monotonic() < deadline, what
            time.sleep(0.1)


def mapper_command(options, args, run=None):
    """The command line of nbdkit OPTIONS <the freshly built plugin> ARGS
    [--run RUN], as tests/functions.sh's mapper () runs it: in the
    environment it sets up for the plugin (NBDMAPPER_PLUGIN_ENV: under a
    sanitizer build, the runtime preloaded), which RUN does not get."""
    env = [v for v in os.environ.get("NBDMAPPER_PLUGIN_ENV", "").split("\n")
           if v]
    cmd = (["env"] + env if env else []) + ["nbdkit"] + list(options)
    cmd += [os.environ["PLUGIN"]] + list(args)
    if run is not None:
        cmd += ["--run", ("unset LD_PRELOAD ASAN_OPTIONS UBSAN_OPTIONS; " if env else "")
                + run]
    return cmd


def _gone(pid):
    """The process is gone, or a zombie (it has closed its sockets and
    files; its parent may be slow to reap it)."""
    try:
        os.kill(pid, 0)
        with open("/proc/%d/stat" % pid) as f:
            return f.read().split()[2] == "Z"
    except (ProcessLookupError, FileNotFoundError):
        return True


def kill_server(d, name, sig=signal.SIGKILL):
    """Kill the server started as NAME in D (tests/functions.sh's
    start_server: pid in D/NAME.pid) and wait until it is gone: the loss
    of a backend, on purpose."""
    pid = int(open("%s/%s.pid" % (d, name)).read())
    os.kill(pid, sig)
    until(lambda: _gone(pid), "pid %d: still there" % pid, 30)


def start_server(d, name, args, wrap=()):
    """tests/functions.sh's start_server NAME ARGS for one of nbdkit's
    plugins (ARGS name it): nbdkit daemonised on D/NAME.sock (unless ARGS
    say where, -p), its pid in D/NAME.pid; returns once it serves.  The
    shell's cleanup stops it at exit as it would the first one.  WRAP: a
    command to run nbdkit under (ip netns exec NS)."""
    pidfile = "%s/%s.pid" % (d, name)
    sock = "%s/%s.sock" % (d, name)
    opts = ["-P", pidfile]
    if not ({"-U", "-p", "--port", "--unix"} & set(args)):
        opts += ["-U", sock]
        if os.path.exists(sock):
            os.unlink(sock)
    if os.path.exists(pidfile):
        os.unlink(pidfile)
    subprocess.check_call(list(wrap) + ["nbdkit"] + opts + list(args))
    until(lambda: os.path.exists(pidfile) and os.path.getsize(pidfile) > 0,
          "%s: no pid file" % name, 30)


def restart_server(d, name, args, wrap=()):
    """kill -9 the server NAME in D and start a new one (start_server) on
    the same socket: a backend that restarts, forgetting its clients."""
    kill_server(d, name)
    start_server(d, name, args, wrap)
