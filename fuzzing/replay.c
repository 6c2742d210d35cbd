/* SPDX-License-Identifier: BSD-3-Clause */
/* The plain driver for the fuzz harnesses: without libFuzzer (make check),
 * feed every file named on the command line to LLVMFuzzerTestOneInput, so
 * each corpus stays a regression test.
 */
#include <config.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput (const uint8_t *data, size_t size);

int
main (int argc, char *argv[])
{
  for (int i = 1; i < argc; i++) {
    FILE *fp = fopen (argv[i], "rb");
    char *buf = NULL;
    size_t len = 0;
    FILE *mem;
    int c;

    if (fp == NULL) {
      perror (argv[i]);
      return 1;
    }
    mem = open_memstream (&buf, &len);
    while ((c = getc (fp)) != EOF)
      putc (c, mem);
    fclose (mem);
    fclose (fp);
    LLVMFuzzerTestOneInput ((const uint8_t *) buf, len);
    free (buf);
  }
  return 0;
}
