/* SPDX-License-Identifier: BSD-3-Clause */
/* Test-only (test-nbdmsetup-persist-faults.sh): preloaded into nbdkit
 * running the real plugin, never installed.  Two things the plugin's
 * tables=DIR code and its handling of crypt keys cannot be checked
 * without from outside the process:
 *
 * - SHIM_FAIL_DIR_FSYNC=1: fsync of a directory fails with EIO (a real
 *   filesystem only does that on a device error), to see what the
 *   control commands report when the file they renamed into place may
 *   not be durable.
 * - SHIM_SECRET=TEXT: free and realloc called from the plugin's own code
 *   on a block that still holds TEXT (a crypt key in hex) write
 *   "persist-shim: freed SECRET" and the caller to SHIM_LOG: memory
 *   that held a key must be wiped before it goes back to the allocator.
 *   With SHIM_SECRET_LIBC=1, libc's own frees too: its streams and
 *   asprintf grow by realloc and free, so a key written through
 *   open_memstream or asprintf leaves copies that are the plugin's
 *   doing.  Frees by nbdkit or OpenSSL are not the plugin's to wipe and
 *   are not looked at: the shim wipes what they free, so that a block
 *   made later from their memory (a FILE that fclose frees) is not
 *   taken for a copy of the plugin's.
 *
 * It replaces free, so it cannot run beside the ASan runtime: the test
 * skips itself in a sanitizer build.
 */
#include <config.h>

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

extern void __libc_free (void *);
extern void *__libc_realloc (void *, size_t);

int
fsync (int fd)
{
  const char *fail = getenv ("SHIM_FAIL_DIR_FSYNC");
  struct stat st;

  if (fail && strcmp (fail, "1") == 0 && fstat (fd, &st) == 0 &&
      S_ISDIR (st.st_mode)) {
    errno = EIO;
    return -1;
  }
  return syscall (SYS_fsync, fd);
}

/* Whether p still holds the secret. */
static bool
holds_secret (void *p)
{
  const char *secret = getenv ("SHIM_SECRET");

  return p && secret && *secret && getenv ("SHIM_LOG") &&
    memmem (p, malloc_usable_size (p), secret, strlen (secret));
}

/* Whether caller is code whose frees are looked at: the plugin's (and
 * libc's, with SHIM_SECRET_LIBC).
 */
static bool
checked_caller (const void *caller, Dl_info *info)
{
  return dladdr (caller, info) && info->dli_fname &&
    (strstr (info->dli_fname, "nbdkit-mapper-plugin") ||
     (getenv ("SHIM_SECRET_LIBC") && strstr (info->dli_fname, "libc.so")));
}

static void
report (const void *caller, const Dl_info *info, const char *what)
{
  static __thread bool busy;    /* fopen and fclose free */
  FILE *fp;

  if (busy)
    return;
  busy = true;
  fp = fopen (getenv ("SHIM_LOG"), "a");
  if (fp) {
    fprintf (fp, "persist-shim: %s SECRET in %s+%#lx\n", what,
             info->dli_sname ? info->dli_sname : "?",
             (unsigned long) ((const char *) caller -
                              (const char *) (info->dli_saddr
                                              ? info->dli_saddr
                                              : info->dli_fbase)));
    fclose (fp);
  }
  busy = false;
}

void
free (void *p)
{
  const void *caller = __builtin_return_address (0);
  Dl_info info;

  if (holds_secret (p)) {
    if (checked_caller (caller, &info))
      report (caller, &info, "freed");
    else
      /* nbdkit's own (the control request that carried the key, its
       * buffers) is not the plugin's to wipe; wiped here, so that a
       * block made from it later (a FILE of libc's fclose frees) is
       * not taken for the plugin's copy.
       */
      explicit_bzero (p, malloc_usable_size (p));
  }
  __libc_free (p);
}

void *
realloc (void *p, size_t size)
{
  const void *caller = __builtin_return_address (0);
  Dl_info info;
  bool hit = holds_secret (p), checked = hit && checked_caller (caller, &info);
  void *q;

  if (hit && !checked && size == 0) {
    explicit_bzero (p, malloc_usable_size (p));
    __libc_free (p);
    return NULL;
  }
  if (hit && !checked) {
    /* As free: not the plugin's, its old bytes wiped (a move by hand). */
    size_t old = malloc_usable_size (p);

    if ((q = malloc (size)) != NULL) {
      memcpy (q, p, old < size ? old : size);
      explicit_bzero (p, old);
      __libc_free (p);
    }
    return q;
  }
  q = __libc_realloc (p, size);
  /* A block that moved left its old bytes behind. */
  if (checked && q && q != p)
    report (caller, &info, "realloc moved");
  return q;
}
