/* Internal: exact, order-independent summation of doubles (binned fixed
 * point, after ReproBLAS), so that any reduction tree (MPI_Iallreduce's,
 * whatever algorithm the engine picks, or the threads backend's loop) gives
 * bitwise the same sum. See exact_sum.c for the format and the error bound.
 *
 * A term is an sbn_xbin of 24 bytes; merging two is exactly commutative and
 * associative, so a sum is a pure function of the multiset of terms. */
#ifndef SBN_EXACT_SUM_H
#define SBN_EXACT_SUM_H

#include <stddef.h>
#include <stdint.h>

/* Largest number of terms one sum may merge (the headroom of the top bin:
 * 55-bit field, 38-bit digits). Groups larger than this are refused. */
#define SBN_XSUM_MAX_TERMS 65536

typedef struct sbn_xbin {
  int64_t w[3];
} sbn_xbin;

/* The empty sum (the sum of no terms, and of +0/-0). */
static inline sbn_xbin sbn_xsum_zero(void) { return (sbn_xbin){{0, 0, 0}}; }

void sbn_xsum_encode_f64(sbn_xbin *out, const double *x, size_t n);
void sbn_xsum_encode_f32(sbn_xbin *out, const float *x, size_t n);
/* inout[i] = inout[i] (+) in[i]. */
void sbn_xsum_merge(sbn_xbin *inout, const sbn_xbin *in, size_t n);
/* acc (+)= x, one double (the threads backend's inner loop). */
void sbn_xsum_add(sbn_xbin *acc, double x);
/* Correctly rounded (to nearest, ties to even) value of each sum. */
void sbn_xsum_decode_f64(double *out, const sbn_xbin *in, size_t n);
void sbn_xsum_decode_f32(float *out, const sbn_xbin *in, size_t n);

/* A control element rides in the same reduction as the data (the MPI
 * backend's signature check): it merges as min and max of a 64-bit hash and
 * max of a status instead of a sum. Both operands of a merge at one position
 * are of the same kind. */
sbn_xbin sbn_xsum_ctrl(uint64_t hash, int status);
/* Returns 1 when every merged hash was equal; *status gets the max status. */
int sbn_xsum_ctrl_read(const sbn_xbin *e, int *status);

#endif
