/* SPDX-License-Identifier: BSD-3-Clause */
/* Test-only: preloaded after the ASan runtime into nbdkit by the
 * sanitizer test runs, never installed.
 *
 * With the ASan runtime preloaded into (uninstrumented) nbdkit, exit()
 * can hang: p11-kit's destructor (loaded by gnutls) calls freelocale,
 * which waits forever for glibc's locale lock.  Why (glibc 2.36, gcc 12's
 * libasan; seen with gdb watching __libc_setlocale_lock): p11-kit's
 * constructor runs before the preloaded runtime is initialised and calls
 * newlocale, which takes that lock as a writer; newlocale's malloc is the
 * first call ASan intercepts, so ASan initialises there
 * (AsanInitInternal), and calls dlerror after a failed dlsym
 * (swift_demangle).  dlerror translates the message with dcgettext, whose
 * read lock the lock's writer is refused (EDEADLK) but whose unlock
 * releases the write lock; newlocale's own unlock then counts as a reader
 * leaving.  From then on the lock counts one reader less than it has:
 * after the next translated message (a strerror, e.g. libnbd's on a
 * failed connect) it stays in a read phase for ever, and the next writer,
 * freelocale at exit, waits for ever.  Nothing nbdmapper does can mend
 * that lock.  The process is exiting, so not freeing that locale is
 * harmless: this freelocale does nothing.  (mapper_strerror, without the
 * locale, only makes the plugin's own messages not trigger it.)
 */
#include <config.h>

#include <locale.h>

void
freelocale (locale_t locale)
{
  (void) locale;
}
