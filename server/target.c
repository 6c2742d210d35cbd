/* The target API's toolkit (target.h): the status emitter, the argument
 * reader and the error prefix (dm's DMEMIT, dm_arg, DM_MSG_PREFIX).
 */
#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"

/* --- status --------------------------------------------------------- */

size_t
target_emit (char *buf, size_t len, size_t used, const char *fmt, ...)
{
  va_list ap;
  int n;

  va_start (ap, fmt);
  n = vsnprintf (used < len ? buf + used : NULL, used < len ? len - used : 0,
                 fmt, ap);
  va_end (ap);
  return used + (n > 0 ? n : 0);
}

/* --- errors --------------------------------------------------------- */

void
mapper_err_prefix (struct mapper_err *err, const char *fmt, ...)
{
  char old[sizeof err->msg];
  size_t n;
  va_list ap;

  if (err == NULL)
    return;
  memcpy (old, err->msg, sizeof old);
  old[sizeof old - 1] = '\0';
  va_start (ap, fmt);
  vsnprintf (err->msg, sizeof err->msg, fmt, ap);
  va_end (ap);
  n = strlen (err->msg);
  snprintf (err->msg + n, sizeof err->msg - n, ": %s", old);
}

/* --- arguments ------------------------------------------------------ */

char *
target_shift_arg (struct target_args *as)
{
  if (as->argc == 0)
    return NULL;
  as->argc--;
  return *as->argv++;
}

int
target_read_arg (const struct target_arg *arg, struct target_args *as,
                 uint64_t *value, struct mapper_err *err)
{
  const char *s = target_shift_arg (as);
  uint64_t v;

  if (s == NULL) {
    mapper_err_set (err, "missing %s", arg->name);
    return -EINVAL;
  }
  if (parse_u64 (s, &v) < 0 || v < arg->min || v > arg->max) {
    mapper_err_set (err, "invalid %s '%s' (%s%s%" PRIu64 " to %" PRIu64 ")",
                    arg->name, s, arg->unit ? arg->unit : "",
                    arg->unit ? ", " : "", arg->min, arg->max);
    return -EINVAL;
  }
  *value = v;
  return 0;
}

int
target_read_sectors (const char *name, struct target_args *as,
                     uint64_t *bytes, struct mapper_err *err)
{
  const char *s = target_shift_arg (as);
  int r;

  if (s == NULL) {
    mapper_err_set (err, "missing %s", name);
    return -EINVAL;
  }
  if ((r = parse_sectors (s, bytes)) < 0) {
    mapper_err_set (err, "%s '%s' %s", name, s, parse_error_text (r));
    return -EINVAL;
  }
  return 0;
}

int
target_read_group (const char *what, unsigned min, unsigned max, bool last,
                   struct target_args *as, struct target_args *group,
                   struct mapper_err *err)
{
  const char *s = target_shift_arg (as);
  uint64_t n;

  if (s == NULL) {
    mapper_err_set (err, "missing number of %ss", what);
    return -EINVAL;
  }
  if (parse_u64 (s, &n) < 0 || n < min || n > max) {
    mapper_err_set (err, "invalid number of %ss '%s' (%u to %u)", what, s,
                    min, max);
    return -EINVAL;
  }
  if (n > as->argc || (last && n != as->argc)) {
    mapper_err_set (err, "%" PRIu64 " %s%s declared but %u given", n, what,
                    n == 1 ? "" : "s", as->argc);
    return -EINVAL;
  }
  *group = (struct target_args) { .argc = n, .argv = as->argv };
  as->argc -= n;
  as->argv += n;
  return 0;
}
