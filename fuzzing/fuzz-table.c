/* SPDX-License-Identifier: BSD-3-Clause */
/* Fuzz harness for the table parser.
 *
 * With clang's libFuzzer:
 *   clang -g -O1 -fsanitize=fuzzer,address -DWITH_LIBFUZZER \
 *     -I../server -I.. fuzz-table.c ../server/.libs/libmapper.a -o fuzz
 *   ./fuzz corpus-table
 * Without it (make check), replay.c replays every file given on the command line
 * so the corpus stays a regression test.
 */
#include <config.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"

int LLVMFuzzerTestOneInput (const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
  struct mapper_err err = { "" };
  struct table *t;
  char *text = malloc (size + 1);
  char out[4096];

  if (text == NULL)
    return 0;
  memcpy (text, data, size);
  text[size] = '\0';
  if (table_parse (text, "fuzz", &t, &err) == 0) {
    table_format (t, out, sizeof out);
    table_summary (t, out, sizeof out);
    table_free (t);
  }
  else if (err.msg[0] == '\0') {
    fprintf (stderr, "table_parse failed without a message\n");
    abort ();
  }
  free (text);
  return 0;
}
