/* SPDX-License-Identifier: BSD-3-Clause */
/* NBD URIs (nbd://, nbds://, nbd+unix://, nbds+unix://): recognised,
 * and normalised into the backend's key, so that spellings of one
 * export are one backend (scheme and host case, the default port, the
 * order of query parameters, relative socket and TLS file paths); a bad
 * URI is refused with a message naming it.  libnbd parses the URI again
 * to connect: only what changes the identity is looked at here.
 */
#include <config.h>

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <unistd.h>

#include "nbd-internal.h"

static const char *const schemes[] = {
  "nbd://", "nbds://", "nbd+unix://", "nbds+unix://",
};

bool
nbd_backend_is_uri (const char *spec)
{
  for (size_t i = 0; i < ARRAY_SIZE (schemes); i++)
    if (strncasecmp (spec, schemes[i], strlen (schemes[i])) == 0)
      return true;
  return false;
}

/* Percent-decode s[0..n) into a new string; NULL on a bad escape. */
static char *
decode (const char *s, size_t n)
{
  char *out = malloc (n + 1), *p = out;

  if (out == NULL)
    return NULL;
  for (size_t i = 0; i < n; i++) {
    if (s[i] == '%') {
      int hi, lo;
      if (i + 2 >= n) {
        free (out);
        return NULL;
      }
      hi = hex_digit (s[i + 1]);
      lo = hex_digit (s[i + 2]);
      if (hi < 0 || lo < 0 || (hi == 0 && lo == 0)) {
        free (out);
        return NULL;
      }
      *p++ = hi << 4 | lo;
      i += 2;
    }
    else
      *p++ = s[i];
  }
  *p = '\0';
  return out;
}

static void
encode (FILE *fp, const char *s)
{
  for (const unsigned char *p = (const unsigned char *) s; *p; p++)
    if (*p <= 0x20 || *p >= 0x7f || strchr ("%&#?;=\"'<>\\", *p))
      fprintf (fp, "%%%02X", *p);
    else
      fputc (*p, fp);
}

static int
cmp_params (const void *a, const void *b)
{
  return strcmp (*(char *const *) a, *(char *const *) b);
}

/* A local path in a query parameter, made absolute: nbdkit changes
 * directory when it daemonizes, and two spellings of one socket are one
 * backend.
 */
static char *
absolute_path (const char *path)
{
  char *r = realpath (path, NULL);
  char cwd[PATH_MAX];

  if (r)
    return r;
  if (path[0] == '/')
    return strdup (path);
  if (getcwd (cwd, sizeof cwd) == NULL)
    return NULL;
  if (asprintf (&r, "%s/%s", cwd, path) == -1)
    return NULL;
  return r;
}

/* The host in the authority [auth, end) ("[user@]host[:port]"); *port
 * is where ":port" starts, or end.  An IPv6 host keeps its brackets.
 */
static const char *
authority_host (const char *auth, const char *end, const char **port)
{
  const char *host = memchr (auth, '@', end - auth);
  const char *p;

  host = host ? host + 1 : auth;
  p = host[0] == '[' ? memchr (host, ']', end - host) : host;
  p = p ? memchr (p, ':', end - p) : NULL;
  *port = p ? p : end;
  return host;
}

bool
nbd_uri_host_is_name (const char *uri)
{
  const char *auth = strstr (uri, "://"), *end, *host, *port;
  char name[256];
  struct in_addr a;

  if (auth == NULL || memmem (uri, auth - uri, "+unix", 5))
    return false;
  auth += 3;
  end = auth + strcspn (auth, "/?");
  host = authority_host (auth, end, &port);
  if (*host == '[')
    return false;                       /* an IPv6 address */
  if ((size_t) (port - host) >= sizeof name)
    return true;
  memcpy (name, host, port - host);
  name[port - host] = '\0';
  return inet_pton (AF_INET, name, &a) != 1;
}

DEFINE_VECTOR_TYPE (param_vector, char *);

int
nbd_backend_normalize (const char *spec, char **out, struct mapper_err *err)
{
  const char *rest, *auth, *auth_end, *path, *path_end, *query;
  CLEANUP_FREE char *scheme = NULL;
  param_vector params = empty_vector;
  char *text = NULL;
  size_t size = 0;
  bool is_unix, has_socket = false;
  FILE *fp = NULL;
  int r = -EINVAL;

  rest = strstr (spec, "://");
  scheme = strndup (spec, rest - spec);
  if (scheme == NULL)
    goto oom;
  for (char *p = scheme; *p; p++)
    *p = *p >= 'A' && *p <= 'Z' ? *p - 'A' + 'a' : *p;
  is_unix = strstr (scheme, "+unix") != NULL;
  if (strchr (spec, '#')) {
    mapper_err_set (err, "%s: NBD URI must not have a fragment ('#')", spec);
    goto out;
  }
  auth = rest + 3;
  auth_end = auth + strcspn (auth, "/?");
  path = auth_end;
  path_end = path + strcspn (path, "?");
  query = *path_end == '?' ? path_end + 1 : NULL;

  fp = open_memstream (&text, &size);
  if (fp == NULL)
    goto oom;
  fprintf (fp, "%s://", scheme);
  if (is_unix) {
    /* Only a user name (for TLS): "nbds+unix://alice@/?socket=..." */
    const char *at = memchr (auth, '@', auth_end - auth);
    if (auth_end != (at ? at + 1 : auth)) {
      mapper_err_set (err, "%s: %s URI takes no host (use ?socket=PATH)",
                      spec, scheme);
      goto out;
    }
    fwrite (auth, 1, auth_end - auth, fp);
  }
  else {
    const char *port, *host = authority_host (auth, auth_end, &port);
    if (host == auth_end) {
      mapper_err_set (err, "%s: %s URI needs a host", spec, scheme);
      goto out;
    }
    fwrite (auth, 1, host - auth, fp);          /* user@, as written */
    for (const char *p = host; p < port; p++)
      fputc (*p >= 'A' && *p <= 'Z' ? *p - 'A' + 'a' : *p, fp);
    if (auth_end - port > 1 &&
        !(auth_end - port == 6 && memcmp (port, ":10809", 6) == 0))
      fwrite (port, 1, auth_end - port, fp);
  }
  if (path == path_end)
    fputc ('/', fp);
  else
    fwrite (path, 1, path_end - path, fp);

  /* Query parameters, sorted, local paths absolute. */
  for (const char *q = query; q && *q; ) {
    size_t n = strcspn (q, "&");
    const char *eq = memchr (q, '=', n);
    char *param;

    if (n > 0) {
      size_t klen = eq ? (size_t) (eq - q) : n;
      if ((klen == 6 && strncmp (q, "socket", 6) == 0) ||
          (klen == 12 && strncmp (q, "tls-psk-file", 12) == 0) ||
          (klen == 16 && strncmp (q, "tls-certificates", 16) == 0)) {
        CLEANUP_FREE char *value = eq ? decode (eq + 1, q + n - eq - 1) : NULL;
        CLEANUP_FREE char *abs = NULL;
        FILE *pf;
        size_t psize;

        if (value == NULL || *value == '\0') {
          mapper_err_set (err, "%s: bad or empty value for '%.*s'", spec,
                          (int) klen, q);
          goto out;
        }
        if ((abs = absolute_path (value)) == NULL)
          goto oom;
        param = NULL;
        pf = open_memstream (&param, &psize);
        if (pf == NULL)
          goto oom;
        fprintf (pf, "%.*s=", (int) klen, q);
        encode (pf, abs);
        if (fclose (pf) == EOF)
          goto oom;
        if (klen == 6)
          has_socket = true;
      }
      else if ((param = strndup (q, n)) == NULL)
        goto oom;
      if (param_vector_append (&params, param) == -1) {
        free (param);
        goto oom;
      }
    }
    q += n;
    if (*q == '&')
      q++;
  }
  if (is_unix && !has_socket) {
    mapper_err_set (err, "%s: %s URI needs ?socket=PATH", spec, scheme);
    goto out;
  }
  if (params.len > 1)
    qsort (params.ptr, params.len, sizeof *params.ptr, cmp_params);
  for (size_t i = 0; i < params.len; i++)
    fprintf (fp, "%c%s", i == 0 ? '?' : '&', params.ptr[i]);
  if (fclose (fp) == EOF) {
    fp = NULL;
    goto oom;
  }
  fp = NULL;
  *out = text;
  text = NULL;
  r = 0;
  goto out;

 oom:
  mapper_err_set (err, "%s: out of memory", spec);
  r = -ENOMEM;
 out:
  if (fp)
    fclose (fp);
  free (text);
  for (size_t i = 0; i < params.len; i++)
    free (params.ptr[i]);
  param_vector_reset (&params);
  return r;
}
