/* Internal: tensor descriptor checks shared by the layer's calls. */
#ifndef SBN_TENSOR_H
#define SBN_TENSOR_H

#include "geom.h"
#include "syncbn.h"

const char *sbn_dtype_name(sbn_dtype dtype);
size_t sbn_dtype_size(sbn_dtype dtype); /* 0 if unknown */

/* Check that `t` (named `name` in messages, e.g. "x") is a valid layer input
 * of `num_features` channels on `device`; fill its (N, C, S) geometry.
 * Records the failure (prefixed with `call`) and returns its status. */
sbn_status sbn_check_input(sbn_geom *geom, const sbn_tensor *t, const char *call,
                           const char *name, int64_t num_features, sbn_device device);
/* Check that `t` has exactly the shape, dtype, layout and device of `ref`. */
sbn_status sbn_check_same(const sbn_tensor *t, const sbn_tensor *ref, const char *call,
                          const char *name, const char *ref_name);
/* Check that a and b are the same memory or do not overlap at all. */
sbn_status sbn_check_alias(const sbn_tensor *a, const sbn_tensor *b, const char *call,
                           const char *a_name, const char *b_name);
/* "[2, 3, 4]" into buf. */
const char *sbn_shape_str(char *buf, size_t cap, const sbn_tensor *t);

#endif
