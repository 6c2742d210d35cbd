"""What the Python parts of the shell tests share (import nbdcheck;
tests/functions.sh puts this directory on PYTHONPATH)."""
import errno
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
