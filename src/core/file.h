/* Internal: opening input files for the loaders. */
#ifndef SBN_FILE_H
#define SBN_FILE_H

#include <stdio.h>

#include "syncbn.h"

/* Open `path` for reading if it is a regular file. A FIFO, device or
 * directory is refused with SBN_STATUS_IO_ERROR (a FIFO would block the
 * loader forever) without blocking: the file is opened non-blocking and
 * checked with fstat before anything is read. `call` prefixes messages. On
 * success *size is the file's size. */
sbn_status sbn_open_regular(FILE **out, size_t *size, const char *path, const char *call);

#endif
