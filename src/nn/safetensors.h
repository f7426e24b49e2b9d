/* Internal: safetensors parsing (validated) and writing, for checkpoint.c. */
#ifndef SBN_NN_SAFETENSORS_H
#define SBN_NN_SAFETENSORS_H

#include "syncbn_nn.h"

typedef struct sbn_nn_st_tensor {
  const char *name; /* points into the parsed JSON */
  const char *dtype_name;
  int sbn_dtype; /* sbn_dtype, -1 for dtypes the library does not use */
  int elsize;
  int ndim;
  int64_t shape[8];
  int64_t numel;
  uint64_t begin, end; /* relative to the data section */
} sbn_nn_st_tensor;

typedef struct sbn_nn_st_file {
  struct cJSON *root;
  sbn_nn_st_tensor *t; /* sorted by name */
  int n;
  const uint8_t *data;
  size_t data_len;
  int has_crc;
  uint32_t crc;
} sbn_nn_st_file;

/* Parse and validate a whole file image (SBN_STATUS_IO_ERROR if corrupt). */
sbn_status sbn_nn_st_parse(sbn_nn_st_file *f, const void *buf, size_t len, const char *call);
void sbn_nn_st_close(sbn_nn_st_file *f);
const sbn_nn_st_tensor *sbn_nn_st_find(const sbn_nn_st_file *f, const char *name);
const char *sbn_nn_st_dtype_name(sbn_dtype d);
/* zlib's CRC32 of n bytes continued from crc (0 to start), for any n. */
uint32_t sbn_nn_st_crc32(uint32_t crc, const void *p, size_t n);

/* Conversions of st_convert.c (PyTorch's copy_ semantics). Whether t's
 * dtype converts to the library's dtypes at all (float8 does not). */
int sbn_nn_st_convertible(const sbn_nn_st_tensor *t);
/* t's values as int64 (floating point truncated toward zero): the index of
 * the first one that has no int64 value (NaN, infinite, out of range;
 * *defined = 0) or whose value lies outside [lo, hi] (*defined = 1, *value
 * set), *raw holding it as a double; -1 when every value is in range. */
int64_t sbn_nn_st_int64_scan(const sbn_nn_st_tensor *t, const uint8_t *data, int64_t lo, int64_t hi, int64_t *value,
                             double *raw, int *defined);
/* Write t's numel values, converted, into dst of dtype (int64: every value
 * checked with sbn_nn_st_int64_scan first). data: the file's data section. */
void sbn_nn_st_convert(void *dst, sbn_dtype dtype, const uint8_t *data, const sbn_nn_st_tensor *t);

sbn_status sbn_nn_st_load_entries(sbn_nn_entry *e, int count, const void *buf, size_t len, unsigned flags,
                                  sbn_nn_load_report *report, int nbt_default, const char *call);
sbn_status sbn_nn_st_save(const char *path, const sbn_nn_entry *e, int count, const char *call);

#endif
