/* Opening input files: regular files only, never blocking on a FIFO. */
#include "file.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "error.h"

static const char *kind_of(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO (named pipe)";
  if (S_ISCHR(m) || S_ISBLK(m)) return "a device";
  if (S_ISSOCK(m)) return "a socket";
  return "not a regular file";
}

sbn_status sbn_open_regular(FILE **out, size_t *size, const char *path, const char *call) {
  *out = NULL, *size = 0;
  /* O_NONBLOCK: opening a FIFO for reading would wait for a writer. */
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return sbn_fail(SBN_STATUS_IO_ERROR, "%s: cannot open %s: %s", call, path, strerror(errno));
  struct stat sb;
  if (fstat(fd, &sb) != 0) {
    int e = errno;
    close(fd);
    return sbn_fail(SBN_STATUS_IO_ERROR, "%s: cannot stat %s: %s", call, path, strerror(e));
  }
  if (!S_ISREG(sb.st_mode)) {
    close(fd);
    return sbn_fail(SBN_STATUS_IO_ERROR, "%s: %s is %s; expected a regular file", call, path, kind_of(sb.st_mode));
  }
  int fl = fcntl(fd, F_GETFL);
  if (fl >= 0) (void)fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
  FILE *f = fdopen(fd, "rb");
  if (!f) {
    int e = errno;
    close(fd);
    return sbn_fail(SBN_STATUS_IO_ERROR, "%s: cannot open %s: %s", call, path, strerror(e));
  }
  *out = f;
  *size = (size_t)sb.st_size;
  return SBN_STATUS_OK;
}
