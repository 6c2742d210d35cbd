/* SPDX-License-Identifier: BSD-3-Clause */
/* The persistent-data layer's block device (struct pd_blockdev) over a
 * target's backend: the metadata devices of thin-pool and clone.  The
 * opaque is the struct backend *; I/O is io_sync, the flush
 * target_flush_backend.
 */
#ifndef NBDMAPPER_TARGETS_PDATA_DEV_H
#define NBDMAPPER_TARGETS_PDATA_DEV_H

#include "pdata/thin-metadata.h"

extern const struct pd_blockdev_ops target_pd_blockdev_ops;

#endif /* NBDMAPPER_TARGETS_PDATA_DEV_H */
