/* Opening the trainer's own files (the resume file, the log): regular files
 * only, refused at once otherwise. Opening a FIFO waits for its other end,
 * and the rank threads would wait with it where a signal cannot stop them. */
#ifndef SBN_TRAIN_FILE_H
#define SBN_TRAIN_FILE_H

#include <stdio.h>

/* fopen(path, mode) ("r", "w" or "a", with or without "b") if path is a
 * regular file; "w" and "a" create a missing one. A FIFO, device or
 * directory is refused without blocking. On failure NULL, with a message
 * naming the file in train_error(). */
FILE *train_fopen(const char *path, const char *mode);
/* 0 if path is missing or a regular file, else -1 with a message in
 * train_error() (for files another program writes, like the plot). */
int train_check_regular(const char *path);

#endif
