# SPDX-License-Identifier: BSD-3-Clause
"""What the Python parts of the shell tests share (import nbdcheck;
tests/functions.sh puts this directory on PYTHONPATH)."""
import errno
import os
import shutil
import signal
import subprocess
import tempfile
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


def mapper_command(options, args):
    """The command line of nbdkit OPTIONS <the freshly built plugin> ARGS,
    as tests/functions.sh's mapper () runs it: in the environment it sets
    up for the plugin (NBDMAPPER_PLUGIN_ENV: under a sanitizer build, the
    runtime preloaded)."""
    env = [v for v in os.environ.get("NBDMAPPER_PLUGIN_ENV", "").split("\n")
           if v]
    cmd = (["env"] + env if env else []) + ["nbdkit"] + list(options)
    return cmd + [os.environ["PLUGIN"]] + list(args)


def mapper_run(options, args, run, timeout=300, stop_wait=30):
    """nbdkit OPTIONS <the plugin> ARGS serving on a Unix socket while the
    shell command RUN runs (with $unixsocket and $uri, as nbdkit's --run
    sets them, and without the sanitizer runtime), then stopped with
    SIGTERM.  Not nbdkit's --run: its exit status is the command's, and
    the server's own (99 after a sanitizer report, which it prints after
    --run has returned) is seen by no one.  Here the server runs in the
    foreground, as start_server runs it under a sanitizer: a
    CompletedProcess whose returncode is the command's, or else the
    server's (it must exit 0 on SIGTERM, within STOP_WAIT s: one killed
    then has failed), and whose stderr has both."""
    d = tempfile.mkdtemp(prefix="mapper-run.")
    sock, pidfile = os.path.join(d, "sock"), os.path.join(d, "pid")
    errfile = os.path.join(d, "stderr")
    try:
        with open(errfile, "w") as err:
            srv = subprocess.Popen(
                mapper_command(["-f", "-U", sock, "-P", pidfile] +
                               list(options), args),
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=err)
        deadline = time.monotonic() + 60
        while not (os.path.exists(pidfile) and os.path.getsize(pidfile)):
            if srv.poll() is not None or time.monotonic() > deadline:
                if srv.poll() is None:
                    srv.kill()
                srv.wait()
                return subprocess.CompletedProcess(
                    run, srv.returncode or 1, "",
                    "nbdkit exited %s before it served:\n%s"
                    % (srv.returncode, open(errfile).read()))
            time.sleep(0.05)
        env = {k: v for k, v in os.environ.items()
               if k not in ("LD_PRELOAD", "ASAN_OPTIONS", "UBSAN_OPTIONS")}
        env.update(unixsocket=sock, uri="nbd+unix://?socket=" + sock)
        try:
            r = subprocess.run(["sh", "-c", run], env=env, timeout=timeout,
                               capture_output=True, text=True)
        finally:
            killed = False
            srv.send_signal(signal.SIGTERM)
            try:
                srv.wait(stop_wait)
            except subprocess.TimeoutExpired:
                srv.kill()
                srv.wait()
                killed = True
        status = r.returncode
        stderr = r.stderr + open(errfile).read()
        if killed:
            # A server that hangs at exit has failed, as in functions.sh.
            status = status or 1
            stderr += ("nbdkit pid %d did not exit within %s s of SIGTERM: "
                       "killed with SIGKILL\n" % (srv.pid, stop_wait))
        elif status == 0 and srv.returncode != 0:
            status = srv.returncode if srv.returncode > 0 else 1
            stderr += ("nbdkit exited %d after the command (99: a sanitizer "
                       "report, above)\n" % srv.returncode)
        return subprocess.CompletedProcess(run, status, r.stdout, stderr)
    finally:
        shutil.rmtree(d, ignore_errors=True)


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
