/* SPDX-License-Identifier: BSD-3-Clause */
/* Who is connected (nbdmsetup clients): one record per client
 * connection, device or control, made at open from what nbdkit tells
 * the plugin of its peer, with the connection's requests in flight
 * counted per worker thread (no line shared by the threads).
 */
#ifndef NBDMAPPER_CLIENTS_H
#define NBDMAPPER_CLIENTS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

struct device;
struct client;
struct client_slot;

/* At open, in the connection's thread (nbdkit_peer_* answer there):
 * dev NULL for the control export.  NULL if out of memory (reported).
 */
struct client *client_open (struct device *dev);
/* At close, once no request of the connection runs. */
void client_close (struct client *c);

/* Around each request of the connection, in the thread serving it. */
struct client_slot *client_request_start (struct client *c);
void client_request_end (struct client_slot *s);

/* One line per connection, in the order they opened: all of them, or
 * those to dev (NULL: the control export), "EXPORT\tFAMILY\tPEER\tTLS\t
 * SINCE\tINFLIGHT\tREQUESTS" (PROTOCOL.md, clients).
 */
void clients_print (FILE *out, bool all, struct device *dev);

#endif /* NBDMAPPER_CLIENTS_H */
