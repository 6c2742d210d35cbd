# SPDX-License-Identifier: BSD-3-Clause
"""The restart property, tested on random sequences of control commands.

After ANY sequence of commands that the server accepted or refused
(create, load, resume, replace, rename, remove, clear, suspend over
stacked and unstacked devices), a server restarted from its tables=DIR
must start and serve the same devices with the same live tables and
uuids.  Each sequence runs against the live server; then a second
server is started on a copy of DIR and compared with it.

  python3 restart_property.py SEQUENCES SEED

Environment: NBDMSETUP, NBDMSETUP_URI (the live server's control
export), DIR (its tables=DIR), WORK (scratch), and what tests/functions.sh
exports for nbdcheck.mapper_run.
"""
import json
import os
import random
import shutil
import subprocess
import sys

from nbdcheck import mapper_run

NBDMSETUP = os.environ["NBDMSETUP"]
DIR = os.environ["DIR"]
WORK = os.environ["WORK"]

NAMES = ["d%d" % i for i in range(5)]
SECTORS = 2048                          # of each backing file


def ms(*args, uri=None, check=False):
    env = dict(os.environ)
    if uri:
        env["NBDMSETUP_URI"] = uri
    r = subprocess.run([NBDMSETUP] + list(args), capture_output=True,
                       text=True, env=env, timeout=120)
    if check and r.returncode != 0:
        raise AssertionError("%s: %s" % (" ".join(args), r.stderr))
    return r


def random_area(rng, files):
    """A target line's arguments over a file or another device, valid
    or not (the server must refuse what does not fit)."""
    length = rng.choice([8, 256, 1024, 2048])
    kind = rng.random()
    if kind < 0.45:
        dev = rng.choice(files)
    elif kind < 0.9:
        dev = "mapper:" + rng.choice(NAMES)
    else:
        return length, "zero"
    offset = rng.choice([0, 0, 8, 1024, 2040])
    return length, "linear %s %d" % (dev, offset)


def random_table(rng, files):
    lines, start = [], 0
    for _ in range(rng.choice([1, 1, 2])):
        length, target = random_area(rng, files)
        lines.append("%d %d %s" % (start, length, target))
        start += length
    return "\n".join(lines)


def existing():
    return [d["name"] for d in
            json.loads(ms("--json", "info", check=True).stdout)["devices"]]


def random_command(rng, files):
    # Mostly commands on devices that exist, else most are refused.
    have = existing()
    name = rng.choice(have if have and rng.random() < 0.75 else NAMES)
    c = rng.random()
    if c < 0.22:
        args = ["create", name]
        if rng.random() < 0.3:
            args += ["--uuid", "U-" + name + "-%d" % rng.randrange(3)]
        if rng.random() < 0.85:
            args += ["--table", random_table(rng, files)]
        else:
            args += ["--notable"]
        return args
    if c < 0.37:
        return ["load", name, "--table", random_table(rng, files)]
    if c < 0.50:
        return ["resume", name]
    if c < 0.68:
        return ["replace", name, "--table", random_table(rng, files)]
    if c < 0.76:
        return ["rename", name, rng.choice(NAMES)]
    if c < 0.86:
        return ["remove"] + (["--force"] if rng.random() < 0.5 else []) + [name]
    if c < 0.92:
        return ["clear", name]
    return ["suspend"] + (["--noflush"] if rng.random() < 0.5 else []) + [name]


def snapshot(uri=None):
    """{name: (uuid, live table text)} of every device of a server."""
    info = json.loads(ms("--json", "info", uri=uri, check=True).stdout)
    state = {}
    for d in info["devices"]:
        table = ms("table", d["name"], uri=uri, check=True).stdout
        state[d["name"]] = (d["uuid"], d["live_table"], table)
    return state


def remove_all():
    """Remove every device, holders first (a held device is refused)."""
    for _ in range(len(NAMES) + 2):
        names = existing()
        if not names:
            return
        for n in names:
            ms("remove", "--force", n)
    raise AssertionError("devices left: %s" % names)


def restarted(seq):
    """Start a server on a copy of DIR; its snapshot, and a sector read
    from each device with a live table."""
    copy = os.path.join(WORK, "copy")
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(DIR, copy)
    out = os.path.join(WORK, "restarted.json")
    script = os.path.join(WORK, "inspect.py")
    with open(script, "w") as f:
        f.write(INSPECT)
    run = "export unixsocket; exec /usr/bin/python3 %s %s" % (script, out)
    r = mapper_run([], ["tables=" + copy], run)
    if r.returncode != 0:
        raise AssertionError("sequence %d: the server does not restart "
                             "from tables=DIR (exit %d):\n%s%s"
                             % (seq, r.returncode, r.stdout, r.stderr))
    with open(out) as f:
        return {k: tuple(v) for k, v in json.load(f).items()}


# Run by the restarted server's --run: $unixsocket is its socket.
INSPECT = r'''
import json, os, sys
sys.path.insert(0, %r)
import restart_property as rp
import nbd
uri = "nbd+unix:///control?socket=" + os.environ["unixsocket"]
state = rp.snapshot(uri)
for name, (uuid, live, table) in state.items():
    if live:
        h = nbd.NBD()
        h.connect_uri("nbd+unix:///%%s?socket=%%s"
                      %% (name, os.environ["unixsocket"]))
        h.pread(512, 0)
        h.shutdown()
json.dump(state, open(sys.argv[1], "w"))
''' % os.path.dirname(os.path.abspath(__file__))


def main():
    sequences, seed = int(sys.argv[1]), int(sys.argv[2])
    files = []
    for i in range(2):
        p = os.path.join(WORK, "f%d.img" % i)
        with open(p, "wb") as f:
            f.truncate(SECTORS * 512)
        files.append(p)
    accepted = refused = 0
    for seq in range(sequences):
        rng = random.Random(seed * 100003 + seq)
        remove_all()
        log = []
        # A base to work on: a device, one stacked on it, one beside.
        for args in (["create", "d0", "--table",
                      "0 2048 linear %s 0" % files[0]],
                     ["create", "d1", "--table", "0 1024 linear mapper:d0 512"],
                     ["create", "d2", "--table", "0 2048 linear %s 0" % files[1]]):
            if rng.random() < 0.8:
                ms(*args)             # d1 fails without d0
        for _ in range(rng.randrange(4, 14)):
            args = random_command(rng, files)
            r = ms(*args)
            log.append("%s -> %s" % (args, "ok" if r.returncode == 0
                                      else r.stderr.strip()))
            if r.returncode == 0:
                accepted += 1
            else:
                refused += 1
        want = snapshot()
        try:
            got = restarted(seq)
        except AssertionError as e:
            raise AssertionError("%s\ncommands:\n  %s" % (e, "\n  ".join(log)))
        if got != want:
            raise AssertionError(
                "sequence %d (seed %d): the restarted server differs\n"
                "live:      %s\nrestarted: %s\ncommands:\n  %s"
                % (seq, seed, want, got, "\n  ".join(log)))
    print("%d sequences: %d commands accepted, %d refused; every "
          "tables=DIR restarted the same" % (sequences, accepted, refused))


if __name__ == "__main__":
    main()
