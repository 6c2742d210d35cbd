/* Tiny unit-test helpers. */
#ifndef NBDMAPPER_UNIT_H
#define NBDMAPPER_UNIT_H
#include <stdio.h>
#include <stdlib.h>
static int unit_failures;
#define CHECK(cond) do { if (!(cond)) { \
  fprintf (stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
  unit_failures++; } } while (0)
#define UNIT_EXIT() do { if (unit_failures) { \
  fprintf (stderr, "%d check(s) failed\n", unit_failures); return 1; } \
  return 0; } while (0)
#endif
