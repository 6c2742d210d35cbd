/* Test-only: preloaded after the ASan runtime into nbdkit by the
 * sanitizer test runs, never installed.
 *
 * With the ASan runtime preloaded into (uninstrumented) nbdkit, a failed
 * start can hang in exit(): p11-kit's destructor (loaded by gnutls) calls
 * freelocale, which waits forever on glibc's locale lock.  The process is
 * exiting, so not freeing that locale is harmless: this freelocale does
 * nothing.
 */
#include <config.h>

#include <locale.h>

void
freelocale (locale_t locale)
{
  (void) locale;
}
