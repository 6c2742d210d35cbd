/* SPDX-License-Identifier: BSD-3-Clause */
/* crc32c (Castagnoli, reflected polynomial 0x82f63b78) as dm computes its
 * block checksums: dm_bm_checksum () is crc32c (~0, data, len) ^ salt,
 * the kernel's crc32c having no final inversion.  Slicing by 8: a 4 KiB
 * block is checksummed on every read from and write to the device.
 */
#include <stddef.h>
#include <stdint.h>
#include <pthread.h>

#include "pdata.h"

static uint32_t table[8][256];
static pthread_once_t table_once = PTHREAD_ONCE_INIT;

static void
make_table (void)
{
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t c = i;
    for (int k = 0; k < 8; k++)
      c = c & 1 ? (c >> 1) ^ 0x82f63b78u : c >> 1;
    table[0][i] = c;
  }
  for (uint32_t i = 0; i < 256; i++)
    for (int t = 1; t < 8; t++)
      table[t][i] = (table[t - 1][i] >> 8) ^ table[0][table[t - 1][i] & 0xff];
}

uint32_t
pd_checksum (const void *data, size_t len, uint32_t xor)
{
  const uint8_t *p = data;
  uint32_t crc = 0xffffffffu;

  pthread_once (&table_once, make_table);
  while (len >= 8) {
    uint32_t lo = pd_le32 (p) ^ crc, hi = pd_le32 (p + 4);
    crc = table[7][lo & 0xff] ^ table[6][(lo >> 8) & 0xff] ^
      table[5][(lo >> 16) & 0xff] ^ table[4][lo >> 24] ^
      table[3][hi & 0xff] ^ table[2][(hi >> 8) & 0xff] ^
      table[1][(hi >> 16) & 0xff] ^ table[0][hi >> 24];
    p += 8;
    len -= 8;
  }
  while (len--)
    crc = (crc >> 8) ^ table[0][(crc ^ *p++) & 0xff];
  return crc ^ xor;
}
