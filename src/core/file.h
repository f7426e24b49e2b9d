/* Internal: opening input files for the loaders; the pieces of an atomic
 * save (which file to replace, a temporary file beside it, writes that
 * cannot kill the process). */
#ifndef SBN_FILE_H
#define SBN_FILE_H

#include <signal.h>
#include <stdio.h>

#include "syncbn.h"

/* Open `path` for reading if it is a regular file. A FIFO, device or
 * directory is refused with SBN_STATUS_IO_ERROR (a FIFO would block the
 * loader forever) without blocking: the file is opened non-blocking and
 * checked with fstat before anything is read. `call` prefixes messages. On
 * success *size is the file's size. */
sbn_status sbn_open_regular(FILE **out, size_t *size, const char *path, const char *call);

/* The file that saving to `path` must replace: `path` itself, or the end
 * of its chain of symbolic links (a dangling link's target, which is then
 * created, as open(O_CREAT) would). Saving there keeps the links. A
 * directory, device, FIFO or socket there is refused (SBN_STATUS_IO_ERROR
 * naming it). *out is malloc'ed; on failure it is NULL and the status says
 * why. */
sbn_status sbn_save_target(char **out, const char *path, const char *call);

/* Create a new empty file from `tmpl`, whose last 6 characters are
 * replaced by [A-Za-z0-9] (as mkstemp), opened read-write with O_EXCL and
 * mode 0666, so the umask and default ACLs apply as to any new file. When
 * `keep_mode_of` names an existing regular file, the new file gets its
 * permissions, owner and group instead (a replaced checkpoint keeps them;
 * owner and group only as far as the caller may set them). Returns the
 * descriptor or -1 with errno set. */
int sbn_create_temp(char *tmpl, const char *keep_mode_of);

/* Writing past RLIMIT_FSIZE raises SIGXFSZ, whose default action kills the
 * process. Between begin and end the calling thread blocks it, so the write
 * fails with EFBIG instead; end consumes the signal that such a write
 * raised (only when `raised` says a write failed with EFBIG and none was
 * pending before) and restores the thread's mask. Other threads and the
 * process-wide disposition are untouched. */
typedef struct sbn_fsize_guard {
  sigset_t old;
  int was_pending;
} sbn_fsize_guard;
void sbn_fsize_guard_begin(sbn_fsize_guard *g);
void sbn_fsize_guard_end(sbn_fsize_guard *g, int raised);
/* RLIMIT_FSIZE's soft limit in bytes, or -1 when unlimited or unknown. */
long long sbn_file_size_limit(void);

#endif
