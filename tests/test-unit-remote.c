/* SPDX-License-Identifier: BSD-3-Clause */
/* Remote backends through the engine API, without engine_start: the I/O
 * loop starts at the first remote request, and again after engine_stop
 * (the backend's connections are adopted by the new loop).  URI
 * normalisation: spellings of one export are one key, bad URIs are
 * refused with a message.  Needs nbdkit (skips otherwise).
 */
#include <config.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "internal.h"
#include "backends/nbd-internal.h"
#include "unit.h"

static pid_t servers[2];

static void
stop_servers (void)
{
  for (size_t i = 0; i < 2; i++)
    if (servers[i] > 0) {
      /* Daemons: not our children, waitpid would not wait for them. */
      unit_stop_server (servers[i]);
      servers[i] = 0;
    }
}

/* Run "nbdkit -P PIDFILE ARGS" (it daemonises); its pid. */
static pid_t
start_server (const char *pidf, const char *args)
{
  char *cmd = unit_sprintf ("nbdkit -P %s %s", pidf, args);
  pid_t pid = 0;

  if (system (cmd) != 0)
    UNIT_FATAL ("%s failed", cmd);
  free (cmd);
  /* The daemon writes its pid file after system() has returned. */
  for (int i = 0; i < 100 && pid <= 0; i++) {
    size_t n;
    char *p = unit_read_file (pidf, &n);
    if (p && n > 0 && p[n - 1] == '\n')
      pid = atoi (p);
    free (p);
    if (pid <= 0)
      usleep (100000);
  }
  if (pid <= 0)
    UNIT_FATAL ("%s: no pid", pidf);
  return pid;
}

/* A TCP socket bound to a free port on 127.0.0.1 (in *port), listening
 * if BACKLOG > 0.
 */
static int
loopback_socket (int backlog, int *port)
{
  struct sockaddr_in a = {
    .sin_family = AF_INET, .sin_addr.s_addr = htonl (INADDR_LOOPBACK),
  };
  socklen_t len = sizeof a;
  int s = socket (AF_INET, SOCK_STREAM, 0);

  if (s == -1 || bind (s, (struct sockaddr *) &a, sizeof a) == -1 ||
      (backlog > 0 && listen (s, backlog) == -1) ||
      getsockname (s, (struct sockaddr *) &a, &len) == -1)
    UNIT_FATAL ("loopback socket: %m");
  *port = ntohs (a.sin_port);
  return s;
}

/* A TCP port on 127.0.0.1 that nothing listens on right now. */
static int
free_port (void)
{
  int port;

  close (loopback_socket (0, &port));
  return port;
}

static void
check_key (const char *spec, const char *want)
{
  struct mapper_err err = { "" };
  char *key = NULL;
  int r = nbd_backend_normalize (spec, &key, &err);

  CHECKF (r == 0 && key && strcmp (key, want) == 0, "%s -> %s (%s), want %s",
          spec, key ? key : "NULL", err.msg, want);
  free (key);
}

static void
check_bad (const char *spec, const char *msg)
{
  struct mapper_err err = { "" };
  char *key = NULL;
  int r = nbd_backend_normalize (spec, &key, &err);

  /* The message names the URI; nothing is returned. */
  CHECKF (r == -EINVAL && strstr (err.msg, msg) &&
          strncmp (err.msg, spec, strlen (spec)) == 0 && key == NULL,
          "%s: r=%d '%s'", spec, r, err.msg);
  free (key);
}

static void
test_normalize (void)
{
  char cwd[4096];
  char *want;

  CHECK (nbd_backend_is_uri ("nbd://h"));
  CHECK (nbd_backend_is_uri ("NBDS+UNIX:///?socket=x"));
  CHECK (!nbd_backend_is_uri ("/dev/nbd0"));
  CHECK (!nbd_backend_is_uri ("nbd+vsock://1"));
  check_key ("nbd://Host.Example:10809", "nbd://host.example/");
  check_key ("NBD://host:10810/exp", "nbd://host:10810/exp");
  check_key ("nbds://alice@[::1]:10809/e?tls-certificates=/etc/pki",
             "nbds://alice@[::1]/e?tls-certificates=/etc/pki");
  check_key ("nbd+unix:///e?tls-x=1&socket=/no/such/s&",
             "nbd+unix:///e?socket=/no/such/s&tls-x=1");
  check_key ("nbd+unix://?socket=/a%20b", "nbd+unix:///?socket=/a%20b");
  check_key ("nbd://h:/e", "nbd://h/e");          /* an empty port */
  CHECK (getcwd (cwd, sizeof cwd) != NULL);
  want = unit_sprintf ("nbds+unix://bob@/?socket=%s/rel.sock", cwd);
  check_key ("nbds+unix://bob@/?socket=rel.sock", want);
  free (want);
  /* The TLS file parameters are local paths too. */
  want = unit_sprintf ("nbds://h/?tls-psk-file=%s/k.psk", cwd);
  check_key ("nbds://h/?tls-psk-file=k.psk", want);
  free (want);
  check_bad ("nbd+unix:///", "needs ?socket=PATH");
  check_bad ("nbd+unix://h/?socket=/s", "takes no host");
  check_bad ("nbd:///", "needs a host");
  check_bad ("nbd://h/#x", "fragment");
  check_bad ("nbd+unix:///?socket=%4", "bad or empty value");
  check_bad ("nbd+unix:///?socket=", "bad or empty value");
  check_bad ("nbd+unix:///?socket", "bad or empty value for 'socket'");
  check_bad ("nbds://h/?tls-psk-file=", "bad or empty value for 'tls-psk-file'");
  check_bad ("nbds://h/?tls-certificates",
             "bad or empty value for 'tls-certificates'");
  check_bad ("nbds+unix://bob@h/?socket=/s", "takes no host");
  check_bad ("nbd://alice@/", "needs a host");
}

/* A table connecting to a server that never answers its handshake must
 * not hold up other tables being built (the backend registry's lock was
 * held across the connect, up to remote-timeout).
 */
struct slow_parse {
  char *text;
  atomic_bool done;
  int r;
};

static void *
slow_parse_thread (void *arg)
{
  struct slow_parse *sp = arg;
  struct mapper_err err = { "" };
  struct table *t = NULL;

  sp->r = table_parse (sp->text, "silent", &t, &err);
  table_free (t);
  atomic_store (&sp->done, true);
  return NULL;
}

static void
test_connect_does_not_block_registry (void)
{
  struct slow_parse sp = { .r = 0 };
  struct mapper_err err = { "" };
  struct table *t;
  pthread_t th;
  const char *file = unit_path ("local.img");
  char *text;
  int s, r, port;

  /* Listens (the kernel completes TCP connects) but never accepts or
   * answers: the handshake waits for remote-timeout.
   */
  s = loopback_socket (16, &port);
  engine_set_remote (0, 3);
  sp.text = unit_sprintf ("0 2048 linear nbd://127.0.0.1:%d/ 0\n", port);
  atomic_init (&sp.done, false);
  if (pthread_create (&th, NULL, slow_parse_thread, &sp) != 0)
    UNIT_FATAL ("pthread_create");
  /* Let the connect start (the outcome does not depend on it: either
   * order passes only if neither waits for the other).
   */
  usleep (200000);
  unit_write_file (file, NULL, 1 << 20);
  text = unit_sprintf ("0 2048 linear %s 0\n", file);
  r = table_parse (text, "local", &t, &err);
  CHECKF (r == 0, "%s", err.msg);
  /* Built while the other is still connecting. */
  CHECKF (!atomic_load (&sp.done), "a local table waited for a remote "
          "backend's connect to time out");
  table_free (t);
  pthread_join (th, NULL);
  CHECKF (sp.r < 0, "the silent server's table loaded");
  close (s);
  engine_set_remote (0, 30);
  free (text);
  free (sp.text);
}

/* I/O through a device over uri, the loop stopped after each round.
 * With a host name in uri, the connections after the probe are made by
 * the resolver thread, and engine_stop may find lookups under way.
 */
static void
test_io (const char *uri)
{
  struct mapper_err err = { "" };
  struct table *t;
  struct device *dev;
  char *text = unit_sprintf ("0 2048 linear %s 0\n"
                             "2048 2048 zero\n", uri);
  static char buf[65536], back[65536];
  int r;

  r = table_parse (text, "remote", &t, &err);
  free (text);
  if (r != 0)
    UNIT_FATAL ("table_parse: %s", err.msg);
  CHECK_EQ (table_caps (t)->size, 4096 * 512);
  CHECK (table_caps (t)->can_write && table_caps (t)->can_multi_conn);
  if (device_create ("remote", &dev, &err) != 0)
    UNIT_FATAL ("device_create: %s", err.msg);
  CHECK (device_load (dev, t) == 0);
  if (device_resume (dev, &err) != 0)
    UNIT_FATAL ("device_resume: %s", err.msg);

  for (int round = 0; round < 3; round++) {
    unit_fill (buf, sizeof buf, round + 1, 0);
    /* Across the remote | zero edge: the zero target is read-only data. */
    CHECK_EQ (device_pwrite (dev, buf, sizeof buf, 1048576 - 65536, 0), 0);
    CHECK_EQ (device_pread (dev, back, sizeof back, 1048576 - 65536, 0), 0);
    CHECK (memcmp (buf, back, sizeof buf) == 0);
    CHECK_EQ (device_flush (dev, 0), 0);
    CHECK_EQ (device_zero (dev, 4096, 1048576 - 4096, MAPPER_FUA), 0);
    CHECK_EQ (device_pread (dev, back, 4096, 1048576 - 4096, 0), 0);
    CHECK (unit_is_zero (back, 4096));
    CHECK_EQ (device_trim (dev, 8192, 0, 0), 0);
    CHECK_EQ (device_pread (dev, back, 8192, 1048576 + 100, 0), 0);
    CHECK (unit_is_zero (back, 8192));
    /* The loop goes; the next request starts a new one, which adopts
     * the backend's connections.
     */
    engine_stop ();
  }
  device_destroy (dev);
}

/* Server i is "nbdkit ARGS"; then test_io over uri.  Frees both. */
static void
serve_and_test (size_t i, char *args, char *uri)
{
  char *pidf = unit_sprintf ("s%zu.pid", i);

  servers[i] = start_server (unit_path (pidf), args);
  test_io (uri);
  free (pidf);
  free (args);
  free (uri);
}

int
main (void)
{
  const char *sock = unit_path ("m.sock");
  int port;

  test_normalize ();
  test_connect_does_not_block_registry ();

  if (system ("nbdkit --version >/dev/null 2>&1") != 0) {
    printf ("%s: skipped: no nbdkit\n", __FILE__);
    return unit_failures ? 1 : 77;
  }
  atexit (stop_servers);
  serve_and_test (0, unit_sprintf ("-U %s memory 1M", sock),
                  unit_sprintf ("nbd+unix:///?socket=%s", sock));
  /* "localhost": a name, looked up by the resolver thread. */
  port = free_port ();
  serve_and_test (1, unit_sprintf ("-i 127.0.0.1 -p %d memory 1M", port),
                  unit_sprintf ("nbd://localhost:%d/", port));
  stop_servers ();
  UNIT_EXIT ();
}
