/* The safetensors format: writing (atomic) and reading with full validation
 * before anything is changed. JSON via cJSON (Debian's libcjson), the data
 * checksum via zlib's crc32.
 *
 *   [8-byte little-endian N][N bytes of JSON header, space-padded][data]
 *   header: {"__metadata__": {"format": "pt", "syncbn_crc32": "1a2b3c4d"},
 *            "name": {"dtype": "F32", "shape": [C], "data_offsets": [b, e]}, ...}
 *
 * A flipped data byte cannot be seen by format checks alone (any bit
 * pattern is a valid float), so save stores the CRC32 of the data section
 * in __metadata__ and load verifies it when present (files written by other
 * tools, e.g. PyTorch, have none and are accepted unchecked). */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "module.h"
#include "safetensors.h"
#include "../core/checked.h"
#include "../core/file.h"

#define ST_MAX_HEADER (100u << 20) /* the safetensors reference limit */
#define ST_MAX_DIMS 8
#define ST_CRC_CHUNK ((size_t)1 << 30)

/* Test hooks (not public): make the next saves fail after writing this many
 * bytes of the temporary file: kind 1 returns an IO error (and removes the
 * temporary file), kind 2 simulates a crash (_exit(3), nothing cleaned). */
long sbn_nn_test_save_fault_at = -1;
int sbn_nn_test_save_fault_kind = 0;

typedef struct st_dtype_info {
  const char *name;
  int size;
  int sbn; /* sbn_dtype or -1 */
} st_dtype_info;

static const st_dtype_info dtypes[] = {
    {"F32", 4, SBN_DTYPE_FLOAT32}, {"I64", 8, SBN_DTYPE_INT64}, {"F64", 8, SBN_DTYPE_FLOAT64},
    {"F16", 2, SBN_DTYPE_FLOAT16}, {"BF16", 2, SBN_DTYPE_BFLOAT16}, {"I32", 4, -1}, {"I16", 2, -1},
    {"I8", 1, -1}, {"U8", 1, -1}, {"U16", 2, -1}, {"U32", 4, -1}, {"U64", 8, -1}, {"BOOL", 1, -1},
    {"F8_E4M3", 1, -1}, {"F8_E5M2", 1, -1}};

static const st_dtype_info *dtype_by_name(const char *s) {
  for (size_t i = 0; i < sizeof dtypes / sizeof *dtypes; i++)
    if (!strcmp(dtypes[i].name, s)) return &dtypes[i];
  return NULL;
}

static const st_dtype_info *dtype_by_sbn(sbn_dtype d) {
  for (size_t i = 0; i < sizeof dtypes / sizeof *dtypes; i++)
    if (dtypes[i].sbn == (int)d) return &dtypes[i];
  return NULL;
}

const char *sbn_nn_st_dtype_name(sbn_dtype d) {
  const st_dtype_info *i = dtype_by_sbn(d);
  return i ? i->name : "?";
}

static int host_is_little_endian(void) {
  const uint16_t one = 1;
  return *(const uint8_t *)&one == 1;
}

/* zlib's crc32 takes a 32-bit length: feed it at most 1 GiB at a time, so a
 * tensor of 4 GiB or more gets the same checksum on save and load. */
uint32_t sbn_nn_st_crc32(uint32_t crc, const void *p, size_t n) {
  const uint8_t *b = p;
  uLong c = crc;
  while (n > 0) {
    size_t k = n > ST_CRC_CHUNK ? ST_CRC_CHUNK : n;
    c = crc32(c, b, (uInt)k);
    b += k, n -= k;
  }
  return (uint32_t)c;
}

/* ------------------------------------------------------------------ */
/* Reading                                                             */
/* ------------------------------------------------------------------ */

static int as_u53(const cJSON *v, uint64_t *out) {
  if (!cJSON_IsNumber(v)) return 0;
  double d = v->valuedouble;
  if (!(d >= 0) || d > 9007199254740992.0 || d != (double)(uint64_t)d) return 0;
  *out = (uint64_t)d;
  return 1;
}

static int cmp_offset(const void *a, const void *b) {
  const sbn_nn_st_tensor *x = a, *y = b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  if (x->end != y->end) return x->end < y->end ? -1 : 1;
  return 0;
}

static int cmp_name(const void *a, const void *b) {
  return strcmp(((const sbn_nn_st_tensor *)a)->name, ((const sbn_nn_st_tensor *)b)->name);
}

void sbn_nn_st_close(sbn_nn_st_file *f) {
  if (f->root) cJSON_Delete(f->root);
  free(f->t);
  memset(f, 0, sizeof *f);
}

/* Record the message (which may point into f) first, then release f. */
static sbn_status close_with(sbn_nn_st_file *f, sbn_status st) {
  sbn_nn_st_close(f);
  return st;
}
#define BAD(...) close_with(f, sbn_fail(SBN_STATUS_IO_ERROR, __VA_ARGS__))

sbn_status sbn_nn_st_parse(sbn_nn_st_file *f, const void *buf, size_t len, const char *call) {
  memset(f, 0, sizeof *f);
  const uint8_t *b = buf;
  if (!buf && len) return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: buffer is NULL", call);
  if (len < 8) return BAD("%s: not a safetensors file: %zu bytes, shorter than the 8-byte header length", call, len);
  uint64_t n = 0;
  for (int i = 7; i >= 0; i--) n = (n << 8) | b[i];
  if (n < 2 || n > ST_MAX_HEADER)
    return BAD("%s: corrupt safetensors file: header length %llu is out of range [2, %u]", call,
               (unsigned long long)n, ST_MAX_HEADER);
  if (n > len - 8)
    return BAD("%s: truncated safetensors file: the header needs %llu bytes, the file has %zu after the length",
               call, (unsigned long long)n, len - 8);
  const char *h = (const char *)b + 8;
  if (h[0] != '{') return BAD("%s: corrupt safetensors header: it does not start with '{'", call);
  const char *end = NULL;
  f->root = cJSON_ParseWithLengthOpts(h, (size_t)n, &end, 0);
  if (!f->root) {
    const char *at = cJSON_GetErrorPtr();
    long off = at && at >= h && at <= h + n ? (long)(at - h) : -1;
    return BAD("%s: corrupt safetensors header: invalid JSON (near byte %ld of %llu)", call, off,
               (unsigned long long)n);
  }
  for (const char *p = end; p < h + n; p++)
    if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r')
      return BAD("%s: corrupt safetensors header: unexpected byte 0x%02x after the JSON object (byte %ld)", call,
                 (unsigned char)*p, (long)(p - h));
  if (!cJSON_IsObject(f->root)) return BAD("%s: corrupt safetensors header: not a JSON object", call);
  int count = 0;
  for (cJSON *c = f->root->child; c; c = c->next) count++;
  f->t = calloc((size_t)count + 1, sizeof *f->t);
  if (!f->t) {
    sbn_nn_st_close(f);
    return sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "%s: out of memory", call);
  }
  f->data = b + 8 + n;
  f->data_len = len - 8 - (size_t)n;
  int seen_meta = 0;
  for (cJSON *c = f->root->child; c; c = c->next) {
    const char *key = c->string;
    if (!key || !*key) return BAD("%s: corrupt safetensors header: an entry has an empty name", call);
    if (!strcmp(key, "__metadata__")) {
      if (seen_meta++) return BAD("%s: corrupt safetensors header: __metadata__ appears twice", call);
      if (!cJSON_IsObject(c)) return BAD("%s: corrupt safetensors header: __metadata__ is not an object", call);
      for (cJSON *m = c->child; m; m = m->next)
        if (!cJSON_IsString(m))
          return BAD("%s: corrupt safetensors header: __metadata__ value \"%s\" is not a string", call,
                     m->string ? m->string : "?");
      cJSON *crc = cJSON_GetObjectItemCaseSensitive(c, "syncbn_crc32");
      if (crc) {
        const char *s = crc->valuestring;
        char *e = NULL;
        unsigned long v = strtoul(s, &e, 16);
        if (strlen(s) != 8 || !e || *e || v > 0xffffffffUL)
          return BAD("%s: corrupt safetensors header: syncbn_crc32 \"%s\" is not 8 hex digits", call, s);
        f->has_crc = 1;
        f->crc = (uint32_t)v;
      }
      continue;
    }
    sbn_nn_st_tensor *t = &f->t[f->n];
    t->name = key;
    if (!cJSON_IsObject(c)) return BAD("%s: corrupt safetensors header: entry \"%s\" is not an object", call, key);
    int fields = 0;
    for (cJSON *m = c->child; m; m = m->next) fields++;
    cJSON *dt = cJSON_GetObjectItemCaseSensitive(c, "dtype");
    cJSON *sh = cJSON_GetObjectItemCaseSensitive(c, "shape");
    cJSON *of = cJSON_GetObjectItemCaseSensitive(c, "data_offsets");
    if (!cJSON_IsString(dt) || !cJSON_IsArray(sh) || !cJSON_IsArray(of) || fields != 3)
      return BAD("%s: corrupt safetensors header: entry \"%s\" needs exactly \"dtype\" (string), \"shape\" and "
                 "\"data_offsets\" (arrays)",
                 call, key);
    const st_dtype_info *di = dtype_by_name(dt->valuestring);
    if (!di) return BAD("%s: corrupt safetensors header: entry \"%s\" has unknown dtype \"%s\"", call, key, dt->valuestring);
    t->dtype_name = di->name;
    t->sbn_dtype = di->sbn;
    t->elsize = di->size;
    int nd = cJSON_GetArraySize(sh);
    if (nd > ST_MAX_DIMS) return BAD("%s: corrupt safetensors header: entry \"%s\" has %d dims (at most %d)", call, key, nd, ST_MAX_DIMS);
    t->ndim = nd;
    uint64_t numel = 1;
    int i = 0;
    for (cJSON *d = sh->child; d; d = d->next, i++) {
      uint64_t v;
      if (!as_u53(d, &v)) return BAD("%s: corrupt safetensors header: entry \"%s\" has a bad shape", call, key);
      t->shape[i] = (int64_t)v;
      if (v && numel > (UINT64_C(1) << 60) / v) return BAD("%s: corrupt safetensors header: entry \"%s\" is too large", call, key);
      numel *= v;
    }
    t->numel = (int64_t)numel;
    uint64_t ob, oe;
    if (cJSON_GetArraySize(of) != 2 || !as_u53(of->child, &ob) || !as_u53(of->child->next, &oe) || ob > oe)
      return BAD("%s: corrupt safetensors header: entry \"%s\" has bad data_offsets", call, key);
    if (oe - ob != numel * (uint64_t)di->size)
      return BAD("%s: corrupt safetensors header: entry \"%s\": data_offsets [%llu, %llu] hold %llu bytes, "
                 "dtype %s and shape need %llu",
                 call, key, (unsigned long long)ob, (unsigned long long)oe, (unsigned long long)(oe - ob),
                 di->name, (unsigned long long)(numel * (uint64_t)di->size));
    t->begin = ob, t->end = oe;
    f->n++;
  }
  /* Names distinct (cJSON keeps duplicate keys). */
  qsort(f->t, (size_t)f->n, sizeof *f->t, cmp_name);
  for (int i = 1; i < f->n; i++)
    if (!strcmp(f->t[i - 1].name, f->t[i].name))
      return BAD("%s: corrupt safetensors header: entry \"%s\" appears twice", call, f->t[i].name);
  /* Offsets tile [0, data_len) exactly: no overlap, no hole, nothing past the end. */
  sbn_nn_st_tensor *byoff = malloc(sizeof *byoff * (size_t)(f->n ? f->n : 1));
  if (!byoff) {
    sbn_nn_st_close(f);
    return sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "%s: out of memory", call);
  }
  memcpy(byoff, f->t, sizeof *byoff * (size_t)f->n);
  qsort(byoff, (size_t)f->n, sizeof *byoff, cmp_offset);
  uint64_t pos = 0;
  for (int i = 0; i < f->n; i++) {
    if (byoff[i].begin != pos) {
      char msg[400];
      snprintf(msg, sizeof msg, "entry \"%s\" starts at %llu, expected %llu (%s)", byoff[i].name,
               (unsigned long long)byoff[i].begin, (unsigned long long)pos,
               byoff[i].begin < pos ? "overlaps the previous entry" : "a hole in the data");
      free(byoff);
      return BAD("%s: corrupt safetensors header: %s", call, msg);
    }
    pos = byoff[i].end;
  }
  free(byoff);
  if (pos != f->data_len)
    return BAD("%s: %s safetensors file: the header describes %llu data bytes, the file has %zu (file size %zu, "
               "expected %llu)",
               call, pos > f->data_len ? "truncated" : "corrupt", (unsigned long long)pos, f->data_len, len,
               (unsigned long long)(8 + n + pos));
  if (f->has_crc) {
    uint32_t crc = sbn_nn_st_crc32(0, f->data, f->data_len);
    if (crc != f->crc)
      return BAD("%s: corrupt safetensors file: data checksum mismatch (CRC32 %08x, header says %08x)", call,
                 (unsigned)crc, (unsigned)f->crc);
  }
  return SBN_STATUS_OK;
}

const sbn_nn_st_tensor *sbn_nn_st_find(const sbn_nn_st_file *f, const char *name) {
  sbn_nn_st_tensor key;
  memset(&key, 0, sizeof key);
  key.name = name;
  return bsearch(&key, f->t, (size_t)f->n, sizeof *f->t, cmp_name);
}

/* ------------------------------------------------------------------ */
/* Loading into entries                                                */
/* ------------------------------------------------------------------ */

static int is_nbt(const char *name) {
  size_t n = strlen(name), k = strlen("num_batches_tracked");
  return n >= k && !strcmp(name + n - k, "num_batches_tracked") && (n == k || name[n - k - 1] == '.');
}

/* Every value, converted to int64, defined (see st_convert.c) and, for
 * num_batches_tracked, in range; the entry may hold any number of them. */
static sbn_status check_int64(const sbn_nn_st_tensor *t, const uint8_t *data, const char *name, const char *call) {
  const int nbt = is_nbt(name);
  int64_t v;
  double bad;
  int defined;
  const int64_t k = sbn_nn_st_int64_scan(t, data, nbt ? 0 : INT64_MIN, nbt ? SBN_NUM_BATCHES_TRACKED_MAX : INT64_MAX,
                                         &v, &bad, &defined);
  if (k < 0) return SBN_STATUS_OK;
  if (defined)
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT,
                    "%s: \"%s\" = %lld is out of range [0, 2^53] (corrupt or foreign checkpoint?)", call, name,
                    (long long)v);
  return sbn_fail(SBN_STATUS_INVALID_ARGUMENT,
                  "%s: \"%s\": value %.17g (index %lld, dtype %s in the checkpoint) has no int64 value for the "
                  "model's I64",
                  call, name, bad, (long long)k, t->dtype_name);
}

/* PyTorch converts any dtype on load (param.copy_(input)); ours are those of
 * st_convert.c. Refused: float8, and values int64 cannot hold. */
static sbn_status check_dtype(const sbn_nn_st_tensor *t, const sbn_nn_entry *e, const uint8_t *data,
                              int exact, const char *call) {
  if (!dtype_by_sbn(e->dtype))
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: entry \"%s\" has an invalid dtype (%d)", call, e->name,
                    (int)e->dtype);
  if (exact && t->sbn_dtype != (int)e->dtype)
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT,
                    "%s: \"%s\" has dtype %s in the checkpoint, the model expects exactly %s", call, e->name,
                    t->dtype_name, sbn_nn_st_dtype_name(e->dtype));
  if (t->sbn_dtype != (int)e->dtype && !sbn_nn_st_convertible(t))
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT,
                    "%s: \"%s\" has dtype %s in the checkpoint, which does not convert to the model's %s", call,
                    e->name, t->dtype_name, sbn_nn_st_dtype_name(e->dtype));
  if (e->dtype == SBN_DTYPE_INT64) return check_int64(t, data, e->name, call);
  return SBN_STATUS_OK;
}

void sbn_nn_load_report_free(sbn_nn_load_report *r) {
  if (!r) return;
  for (int i = 0; i < r->num_missing; i++) free(r->missing[i]);
  for (int i = 0; i < r->num_unexpected; i++) free(r->unexpected[i]);
  free(r->missing), free(r->unexpected);
  memset(r, 0, sizeof *r);
}

static void list_names(char *out, size_t cap, char **names, int n) {
  size_t k = 0;
  out[0] = 0;
  for (int i = 0; i < n && k + 1 < cap; i++) {
    if (i == 4) {
      snprintf(out + k, cap - k, ", ... (%d in all)", n);
      return;
    }
    k += (size_t)snprintf(out + k, cap - k, "%s\"%s\"", i ? ", " : "", names[i]);
  }
}

sbn_status sbn_nn_st_load_entries(sbn_nn_entry *e, int count, const void *buf, size_t len, unsigned flags,
                                  sbn_nn_load_report *report, int nbt_default, const char *call) {
  if (report) memset(report, 0, sizeof *report);
  if (!e && count > 0) return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: entries is NULL", call);
  if (!host_is_little_endian())
    return sbn_fail(SBN_STATUS_UNSUPPORTED, "%s: safetensors data is little-endian; big-endian hosts are not supported", call);
  const unsigned unknown = flags & ~(unsigned)(SBN_NN_LOAD_STRICT | SBN_NN_LOAD_EXACT_DTYPES);
  if (unknown) return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: unknown flags 0x%x", call, unknown);
  sbn_nn_st_file f;
  sbn_status st = sbn_nn_st_parse(&f, buf, len, call);
  if (st != SBN_STATUS_OK) return st;
  const int strict = (flags & SBN_NN_LOAD_STRICT) != 0, exact = (flags & SBN_NN_LOAD_EXACT_DTYPES) != 0;
  const sbn_nn_st_tensor **src = calloc((size_t)count + 1, sizeof *src);
  char *used = calloc((size_t)f.n + 1, 1);
  char **missing = calloc((size_t)count + 1, sizeof *missing);
  char **unexpected = calloc((size_t)f.n + 1, sizeof *unexpected);
  int nmiss = 0, nunexp = 0;
  st = (src && used && missing && unexpected) ? SBN_STATUS_OK : sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "%s: out of memory", call);
  for (int i = 0; st == SBN_STATUS_OK && i < count; i++) {
    const sbn_nn_st_tensor *t = sbn_nn_st_find(&f, e[i].name);
    if (!t) {
      if (nbt_default && is_nbt(e[i].name) && e[i].dtype == SBN_DTYPE_INT64 && e[i].numel == 1) continue; /* -> 0 */
      missing[nmiss++] = e[i].name;
      continue;
    }
    used[t - f.t] = 1;
    int same = t->ndim == e[i].ndim;
    for (int d = 0; same && d < t->ndim; d++) same = t->shape[d] == e[i].shape[d];
    /* PyTorch's backward compatibility: a 1-element 1-D tensor loads into a
     * 0-dim one (state dicts of PyTorch 0.3). */
    if (!same && e[i].ndim == 0 && t->ndim == 1 && t->shape[0] == 1) same = 1;
    if (!same) {
      char a[128], b[128];
      st = sbn_fail(SBN_STATUS_INVALID_ARGUMENT,
                    "%s: size mismatch for \"%s\": shape %s in the checkpoint, %s in the model", call, e[i].name,
                    sbn_nn_shape_str(a, sizeof a, t->ndim, t->shape), sbn_nn_shape_str(b, sizeof b, e[i].ndim, e[i].shape));
      break;
    }
    if ((st = check_dtype(t, &e[i], f.data, exact, call)) != SBN_STATUS_OK) break;
    src[i] = t;
  }
  if (st == SBN_STATUS_OK)
    for (int j = 0; j < f.n; j++)
      if (!used[j]) unexpected[nunexp++] = (char *)f.t[j].name;
  if (st == SBN_STATUS_OK && strict && (nmiss || nunexp)) {
    char a[600] = "", b[600] = "";
    list_names(a, sizeof a, missing, nmiss);
    list_names(b, sizeof b, unexpected, nunexp);
    st = sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: error(s) in loading state: %d missing key(s)%s%s; %d unexpected key(s)%s%s",
                  call, nmiss, nmiss ? ": " : "", a, nunexp, nunexp ? ": " : "", b);
  }
  sbn_nn_load_report rep = {0, NULL, 0, NULL};
  if (st == SBN_STATUS_OK && report) {
    rep.missing = calloc((size_t)nmiss + 1, sizeof(char *));
    rep.unexpected = calloc((size_t)nunexp + 1, sizeof(char *));
    int ok = rep.missing && rep.unexpected;
    for (int i = 0; ok && i < nmiss; i++) ok = (rep.missing[rep.num_missing++] = strdup(missing[i])) != NULL;
    for (int i = 0; ok && i < nunexp; i++) ok = (rep.unexpected[rep.num_unexpected++] = strdup(unexpected[i])) != NULL;
    if (!ok) {
      sbn_nn_load_report_free(&rep);
      st = sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "%s: out of memory", call);
    }
  }
  if (st == SBN_STATUS_OK) {
    /* Everything checked: commit. Nothing below can fail. */
    for (int i = 0; i < count; i++) {
      if (src[i])
        sbn_nn_st_convert(e[i].data, e[i].dtype, f.data, src[i]);
      else if (nbt_default && is_nbt(e[i].name) && e[i].dtype == SBN_DTYPE_INT64 && e[i].numel == 1) {
        int is_missing = 0;
        for (int k = 0; k < nmiss; k++) is_missing |= missing[k] == e[i].name;
        if (!is_missing) *(int64_t *)e[i].data = 0;
      }
    }
    if (report) *report = rep;
  }
  free(src), free(used), free(missing), free(unexpected);
  sbn_nn_st_close(&f);
  return st;
}

/* ------------------------------------------------------------------ */
/* Writing                                                             */
/* ------------------------------------------------------------------ */

static size_t entry_bytes(const sbn_nn_entry *e) {
  const st_dtype_info *d = dtype_by_sbn(e->dtype);
  return (size_t)e->numel * (size_t)(d ? d->size : 0);
}

static int write_all(int fd, const void *p, size_t n, long *written) {
  const uint8_t *b = p;
  while (n > 0) {
    size_t chunk = n > (1u << 30) ? (1u << 30) : n;
    if (sbn_nn_test_save_fault_at >= 0 && *written + (long)chunk > sbn_nn_test_save_fault_at) {
      size_t part = (size_t)(sbn_nn_test_save_fault_at - *written);
      if (part) (void)!write(fd, b, part);
      if (sbn_nn_test_save_fault_kind == 2) _exit(3);
      errno = EIO;
      return -1;
    }
    ssize_t w = write(fd, b, chunk);
    if (w < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    b += w, n -= (size_t)w, *written += (long)w;
  }
  return 0;
}

/* Temporary files are "<base>" ST_TMP_MARK "XXXXXX" beside the target
 * <base>, the X's filled by mkstemp from [A-Za-z0-9]. The marker keeps a
 * user's file such as "<base>.tmp-backup" from ever looking like one of
 * ours. A base too long for that to fit the directory's NAME_MAX gets the
 * short form ST_TMP_MARK "<16 hex digits of a hash of base>-XXXXXX" instead,
 * still in the same directory so the rename stays atomic. The part before
 * the X's is the "stem". */
#define ST_TMP_MARK ".tmp-syncbn-"
#define ST_TMP_RANDOM 6

static int is_our_temp(const char *name, const char *stem, size_t sl) {
  if (strncmp(name, stem, sl)) return 0;
  const char *r = name + sl;
  for (int i = 0; i < ST_TMP_RANDOM; i++, r++)
    if (!((*r >= 'A' && *r <= 'Z') || (*r >= 'a' && *r <= 'z') || (*r >= '0' && *r <= '9'))) return 0;
  return *r == 0;
}

/* A save that crashed (kill -9, power loss) leaves its temporary file
 * behind. Before writing, remove those of <dir>/<stem> that no live writer
 * owns: a writer holds an exclusive flock on its temporary file until it has
 * been renamed, and a crashed process holds no lock. Files changed in the
 * last few seconds are left for the next save (a writer between mkstemp and
 * flock is unlocked for an instant). Best effort: nothing here fails a save. */
static void remove_stale_temps(const char *dir, const char *stem) {
  size_t sl = strlen(stem);
  DIR *d = sl ? opendir(dir) : NULL;
  if (!d) return;
  const time_t now = time(NULL);
  for (struct dirent *de; (de = readdir(d));) {
    const char *n = de->d_name;
    char full[8192];
    if (!is_our_temp(n, stem, sl) || snprintf(full, sizeof full, "%s/%s", dir, n) >= (int)sizeof full) continue;
    int fd = open(full, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) continue;
    struct stat sb;
    if (fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) && now - sb.st_mtime >= 5 && flock(fd, LOCK_EX | LOCK_NB) == 0)
      unlink(full);
    close(fd);
  }
  closedir(d);
}

static int cmp_str_ptr(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Names distinct, by sorting pointers to them: O(n log n) for the largest
 * state dicts. */
static sbn_status check_distinct(const sbn_nn_entry *e, int count, const char *call) {
  const char **names = malloc(sizeof *names * (size_t)(count ? count : 1));
  if (!names) return sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "%s: out of memory", call);
  for (int i = 0; i < count; i++) names[i] = e[i].name;
  qsort(names, (size_t)count, sizeof *names, cmp_str_ptr);
  sbn_status st = SBN_STATUS_OK;
  for (int i = 1; i < count && st == SBN_STATUS_OK; i++)
    if (!strcmp(names[i - 1], names[i]))
      st = sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: entry \"%s\" appears twice", call, names[i]);
  free(names);
  return st;
}

/* The data of a save: the header, then each entry's bytes, through one
 * descriptor. Returns 0, or -1 with errno set. */
static int write_file_data(int fd, const char *hdr, size_t hdr_len, const sbn_nn_entry *e, int count) {
  long written = 0;
  if (write_all(fd, hdr, hdr_len, &written) != 0) return -1;
  for (int i = 0; i < count; i++)
    if (write_all(fd, e[i].data, entry_bytes(&e[i]), &written) != 0) return -1;
  return 0;
}

static unsigned long long file_bytes(size_t hdr_len, const sbn_nn_entry *e, int count) {
  unsigned long long n = hdr_len;
  for (int i = 0; i < count; i++) n += entry_bytes(&e[i]);
  return n;
}

static sbn_status write_failed(const char *call, const char *path, int err, unsigned long long need) {
  const long long limit = sbn_file_size_limit();
  if (err == EFBIG && limit >= 0)
    return sbn_fail(SBN_STATUS_IO_ERROR,
                    "%s: writing %s failed: %s: the checkpoint takes %llu bytes, over the file size limit "
                    "(RLIMIT_FSIZE, ulimit -f) of %lld bytes (the previous file, if any, is intact)",
                    call, path, strerror(err), need, limit);
  return sbn_fail(SBN_STATUS_IO_ERROR, "%s: writing %s failed: %s (the previous file, if any, is intact)", call, path,
                  strerror(err));
}

/* The temporary file's template <dir>/<stem>XXXXXX (*tmp), the stem alone
 * (*stem) and the directory holding target (*dir). */
static int temp_names(const char *target, char **tmp, char **stem, char **dir) {
  const size_t pl = strlen(target);
  const char *slash = strrchr(target, '/'), *base = slash ? slash + 1 : target;
  const size_t dl = (size_t)(base - target), bl = strlen(base), ml = strlen(ST_TMP_MARK);
  *tmp = malloc(pl + ml + 17 + ST_TMP_RANDOM + 1), *stem = malloc(bl + ml + 18), *dir = malloc(pl + 2);
  if (!*tmp || !*stem || !*dir) return free(*tmp), free(*stem), free(*dir), *tmp = *stem = *dir = NULL, -1;
  if (!slash) strcpy(*dir, ".");
  else if (slash == target) strcpy(*dir, "/");
  else memcpy(*dir, target, dl - 1), (*dir)[dl - 1] = 0;
  long name_max = pathconf(*dir, _PC_NAME_MAX);
  if (name_max <= 0) name_max = 255; /* unknown: Linux file systems' usual limit */
  if (bl + ml + ST_TMP_RANDOM <= (size_t)name_max) {
    snprintf(*stem, bl + ml + 18, "%s%s", base, ST_TMP_MARK);
  } else {
    uint64_t h = 0xcbf29ce484222325u; /* FNV-1a: concurrent saves of one target share the stem */
    for (const unsigned char *c = (const unsigned char *)base; *c; c++) h = (h ^ *c) * 0x100000001b3u;
    snprintf(*stem, bl + ml + 18, "%s%016llx-", ST_TMP_MARK, (unsigned long long)h);
  }
  snprintf(*tmp, pl + ml + 17 + ST_TMP_RANDOM + 1, "%.*s%sXXXXXX", (int)dl, target, *stem);
  return 0;
}

/* Atomic write: a temporary file beside the file being replaced, fsync,
 * rename over it, fsync of the directory. A path that is a symbolic link
 * replaces the link's target, keeping the link; a replaced file keeps its
 * permissions, a new one gets 0666 less the umask. */
static sbn_status save_atomically(const char *path, const char *hdr, size_t hdr_len, const sbn_nn_entry *e,
                                  int count, const char *call) {
  char *target, *tmp = NULL, *stem = NULL, *dir = NULL;
  sbn_status st = sbn_save_target(&target, path, call);
  if (st != SBN_STATUS_OK) return st;
  if (temp_names(target, &tmp, &stem, &dir) != 0) {
    free(target);
    return sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "%s: out of memory", call);
  }
  const char *slash = strrchr(target, '/');
  if ((slash ? slash[1] : *target) != 0) remove_stale_temps(dir, stem); /* no base: no temps of its own */
  int fd = sbn_create_temp(tmp, target);
  if (fd < 0) {
    st = sbn_fail(SBN_STATUS_IO_ERROR, "%s: cannot create a temporary file next to %s: %s", call, target,
                  strerror(errno));
  } else {
    /* The lock marks the file as live until renamed (remove_stale_temps
     * removes unlocked leftovers of crashed saves), so rename before close. */
    (void)flock(fd, LOCK_EX | LOCK_NB);
    sbn_fsize_guard guard;
    sbn_fsize_guard_begin(&guard);
    int err = write_file_data(fd, hdr, hdr_len, e, count) != 0;
    int saved = errno;
    sbn_fsize_guard_end(&guard, err && saved == EFBIG);
    if (!err && fsync(fd) != 0) err = 1, saved = errno;
    if (!err && rename(tmp, target) != 0) err = 1, saved = errno;
    if (close(fd) != 0 && !err) err = 1, saved = errno;
    if (err) {
      unlink(tmp);
      st = write_failed(call, path, saved, file_bytes(hdr_len, e, count));
    } else {
      int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
      if (dfd >= 0) {
        if (fsync(dfd) != 0 && errno != EINVAL)
          st = sbn_fail(SBN_STATUS_IO_ERROR, "%s: fsync of directory %s failed: %s", call, dir, strerror(errno));
        close(dfd);
      }
    }
  }
  free(target), free(tmp), free(stem), free(dir);
  return st;
}

sbn_status sbn_nn_st_save(const char *path, const sbn_nn_entry *e, int count, const char *call) {
  if (!path || (!e && count > 0)) return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: NULL argument", call);
  if (!*path) return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: the path is empty", call);
  if (count < 0) return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: count %d is negative", call, count);
  if (!host_is_little_endian())
    return sbn_fail(SBN_STATUS_UNSUPPORTED, "%s: big-endian hosts are not supported", call);
  for (int i = 0; i < count; i++) {
    if (!e[i].name[0] || !strcmp(e[i].name, "__metadata__"))
      return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: entry %d has an invalid name", call, i);
    if (!dtype_by_sbn(e[i].dtype) || e[i].numel < 0 || (e[i].numel > 0 && !e[i].data) || e[i].ndim < 0 ||
        e[i].ndim > SBN_MAX_DIMS)
      return sbn_fail(SBN_STATUS_INVALID_ARGUMENT, "%s: entry \"%s\" has a bad dtype, shape or data", call, e[i].name);
    int64_t numel;
    size_t nb;
    if (!sbn_shape_numel(&numel, e[i].ndim, e[i].shape) || numel != e[i].numel ||
        !sbn_bytes(&nb, numel, (size_t)dtype_by_sbn(e[i].dtype)->size)) {
      char sh[128];
      return sbn_fail(SBN_STATUS_INVALID_ARGUMENT,
                      "%s: entry \"%s\" has numel %lld but its shape %s holds %s (nothing was written)", call,
                      e[i].name, (long long)e[i].numel, sbn_nn_shape_str(sh, sizeof sh, e[i].ndim, e[i].shape),
                      sbn_shape_numel(&numel, e[i].ndim, e[i].shape) ? "a different count" : "an overflowing count");
    }
  }
  sbn_status st = check_distinct(e, count, call);
  if (st != SBN_STATUS_OK) return st;
  /* Header. */
  uint32_t crc = 0;
  cJSON *root = cJSON_CreateObject(), *meta = cJSON_AddObjectToObject(root, "__metadata__");
  int ok = root && meta && cJSON_AddStringToObject(meta, "format", "pt");
  uint64_t off = 0;
  for (int i = 0; ok && i < count; i++) {
    size_t nb = entry_bytes(&e[i]);
    crc = sbn_nn_st_crc32(crc, e[i].data, nb);
    cJSON *t = cJSON_AddObjectToObject(root, e[i].name);
    ok = t && cJSON_AddStringToObject(t, "dtype", sbn_nn_st_dtype_name(e[i].dtype));
    cJSON *sh = ok ? cJSON_AddArrayToObject(t, "shape") : NULL, *of = NULL;
    ok = ok && sh;
    for (int d = 0; ok && d < e[i].ndim; d++) ok = cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)e[i].shape[d]));
    if (ok) of = cJSON_AddArrayToObject(t, "data_offsets");
    ok = ok && of && cJSON_AddItemToArray(of, cJSON_CreateNumber((double)off)) &&
         cJSON_AddItemToArray(of, cJSON_CreateNumber((double)(off + nb)));
    off += nb;
  }
  char crcs[16];
  snprintf(crcs, sizeof crcs, "%08x", (unsigned)crc);
  ok = ok && cJSON_AddStringToObject(meta, "syncbn_crc32", crcs);
  char *json = ok ? cJSON_PrintUnformatted(root) : NULL;
  cJSON_Delete(root);
  if (!json) return sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "%s: out of memory building the header", call);
  size_t jl = strlen(json), hl = (jl + 7) / 8 * 8;
  if (hl > ST_MAX_HEADER) {
    free(json);
    return sbn_fail(SBN_STATUS_INVALID_ARGUMENT,
                    "%s: the header of %d entries would take %zu bytes, over the format's limit of %u (100 MiB); "
                    "nothing was written",
                    call, count, hl, ST_MAX_HEADER);
  }
  char *hdr = malloc(8 + hl);
  if (!hdr) {
    free(json);
    return sbn_fail(SBN_STATUS_OUT_OF_MEMORY, "%s: out of memory", call);
  }
  for (int i = 0; i < 8; i++) hdr[i] = (char)(((uint64_t)hl >> (8 * i)) & 0xff);
  memcpy(hdr + 8, json, jl);
  memset(hdr + 8 + jl, ' ', hl - jl);
  free(json);

  st = save_atomically(path, hdr, 8 + hl, e, count, call);
  free(hdr);
  return st;
}
