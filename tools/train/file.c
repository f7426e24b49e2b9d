#include "file.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fail.h"

/* As the library words it for its loaders (the tool keeps to the public API). */
static const char *kind_of(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO (named pipe)";
  if (S_ISCHR(m) || S_ISBLK(m)) return "a device";
  if (S_ISSOCK(m)) return "a socket";
  return "not a regular file";
}

static void not_regular(const char *path, mode_t m) {
  train_fail(SBN_STATUS_IO_ERROR, "%s is %s; expected a regular file", path, kind_of(m));
}

FILE *train_fopen(const char *path, const char *mode) {
  int flags = mode[0] == 'r' ? O_RDONLY : mode[0] == 'w' ? O_WRONLY | O_CREAT | O_TRUNC : O_WRONLY | O_CREAT | O_APPEND;
  /* O_NONBLOCK: a FIFO opens at once (or fails with ENXIO for writing
   * without a reader) and fstat then tells what it is */
  int fd = open(path, flags | O_NONBLOCK | O_CLOEXEC, 0644);
  struct stat sb;
  if (fd < 0) {
    int e = errno;
    if (e == ENXIO && stat(path, &sb) == 0 && !S_ISREG(sb.st_mode)) not_regular(path, sb.st_mode);
    else train_fail(SBN_STATUS_IO_ERROR, "cannot open %s: %s", path, strerror(e));
    errno = e;
    return NULL;
  }
  if (fstat(fd, &sb) != 0) {
    train_fail(SBN_STATUS_IO_ERROR, "cannot stat %s: %s", path, strerror(errno));
    close(fd);
    return NULL;
  }
  if (!S_ISREG(sb.st_mode)) {
    not_regular(path, sb.st_mode);
    close(fd);
    return NULL;
  }
  int fl = fcntl(fd, F_GETFL);
  if (fl >= 0) (void)fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
  FILE *f = fdopen(fd, mode);
  if (!f) {
    train_fail(SBN_STATUS_IO_ERROR, "cannot open %s: %s", path, strerror(errno));
    close(fd);
  }
  return f;
}

int train_check_regular(const char *path) {
  struct stat sb;
  if (stat(path, &sb) != 0 || S_ISREG(sb.st_mode)) return 0;
  not_regular(path, sb.st_mode);
  return -1;
}
