/* SPDX-License-Identifier: BSD-3-Clause */
/* Test-only (test-harness.sh), preloaded into nbdkit, never installed:
 * the process that served (accepted a connection) ends as one with a
 * sanitizer report does, a report on stderr and exit status 99, so that
 * the harness can be seen to fail such a test whichever build it is.
 */
#include <config.h>

#include <stdbool.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

static volatile bool served;

int
accept4 (int fd, struct sockaddr *addr, socklen_t *len, int flags)
{
  served = true;
  return syscall (SYS_accept4, fd, addr, len, flags);
}

int
accept (int fd, struct sockaddr *addr, socklen_t *len)
{
  served = true;
  return syscall (SYS_accept4, fd, addr, len, 0);
}

__attribute__ ((destructor))
static void
report (void)
{
  if (served) {
    fprintf (stderr, "==%d==ERROR: AddressSanitizer: a report made by "
             "tests/report-shim.c\n", (int) getpid ());
    _exit (99);
  }
}
