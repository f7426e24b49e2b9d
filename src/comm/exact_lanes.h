/* Internal: the exact sum (exact_sum.h) in integer lanes, for a window
 * agreed in advance, so that an engine's built-in integer sum (MPI_SUM on
 * MPI_INT64_T: no user operation, 16 bytes per value instead of 24) gives
 * exactly the bits of the binned sum.
 *
 * A value's window is the binned sum's three bins below a given top bin T:
 * bits [38(T-2), 38(T+1)) in units of 2^-1074, a 114-bit integer. A term
 * FITS when all its nonzero bits lie in the window (finite, leading bit
 * below 38(T+1), lowest set bit at or above 38(T-2)). A fitting term is the
 * 114-bit integer, cut into two signed digits of 57 bits (lanes hi, lo).
 *
 * Why the bits are the binned sum's: when every term of every rank fits,
 * no term loses a bit, in this window or in the binned sum's (whose window
 * sits at the largest term's top bin, at most T, so its lowest kept bit is
 * at most this one's), so both hold the exact sum of the terms and round it
 * once the same way. Lane sums are exact integer sums (|sum| < P 2^57 <=
 * 2^63 for P <= SBN_XLANES_MAX_TERMS), so any order and any reduction tree
 * gives the same lanes. A term that does not fit (or inf/NaN) is reported,
 * and the caller falls back to the binned sum for the whole call.
 *
 * Encode and decode run in blocks, vectorized per instruction set
 * (exact_lanes_blocks.c), with the scalar reference (exact_lanes.c) for
 * blocks holding an unusual value: the outputs are the reference's. */
#ifndef SBN_EXACT_LANES_H
#define SBN_EXACT_LANES_H

#include <stddef.h>
#include <stdint.h>

#include "exact_sum.h"

/* Most terms a lane sum may hold (headroom of the 57-bit digits). */
#define SBN_XLANES_MAX_TERMS 63

/* out[2i], out[2i+1] = lanes of x[i] in the window of top[i]. Returns the
 * number of terms that do not fit (their lanes are set to 0). */
size_t sbn_xlanes_encode_f64(int64_t *out, const double *x, const uint8_t *top, size_t n);
size_t sbn_xlanes_encode_f32(int64_t *out, const float *x, const uint8_t *top, size_t n);
/* The number of x[i] that do not fit their window (no output). */
size_t sbn_xlanes_misfits_f64(const double *x, const uint8_t *top, size_t n);
size_t sbn_xlanes_misfits_f32(const float *x, const uint8_t *top, size_t n);
/* Correctly rounded value of each lane sum (what sbn_xsum_decode_* gives
 * for the binned sum of the same terms). */
void sbn_xlanes_decode_f64(double *out, const int64_t *lanes, const uint8_t *top, size_t n);
void sbn_xlanes_decode_f32(float *out, const int64_t *lanes, const uint8_t *top, size_t n);
/* The scalar reference of the six functions above (value by value, every
 * case): they give exactly its outputs. For the tests and the benchmark. */
size_t sbn_xlanes_encode_ref_f64(int64_t *out, const double *x, const uint8_t *top, size_t n);
size_t sbn_xlanes_encode_ref_f32(int64_t *out, const float *x, const uint8_t *top, size_t n);
size_t sbn_xlanes_misfits_ref_f64(const double *x, const uint8_t *top, size_t n);
size_t sbn_xlanes_misfits_ref_f32(const float *x, const uint8_t *top, size_t n);
void sbn_xlanes_decode_ref_f64(double *out, const int64_t *lanes, const uint8_t *top, size_t n);
void sbn_xlanes_decode_ref_f32(float *out, const int64_t *lanes, const uint8_t *top, size_t n);
/* The block kernels' instruction-set variants, numbered 0 .. count-1
 * ("generic", "avx2", "avx512"). At first use the CPU's best, or
 * SYNCBN_CPU_ISA's when this CPU supports it. set: 0, or -1 (the name is
 * unknown or unsupported; nothing changes). For tests and benchmarks. */
int sbn_xlanes_isa_count(void);
const char *sbn_xlanes_isa_name(int isa);
int sbn_xlanes_isa_supported(int isa);
int sbn_xlanes_set_isa(const char *name);
const char *sbn_xlanes_get_isa(void);
/* The number of the variant in use (exact_pair.c's bulk sums follow it). */
int sbn_xlanes_isa(void);
/* The binned sum of lanes (hi, lo) in the window of top T. */
sbn_xbin sbn_xlanes_to_xbin(int64_t hi, int64_t lo, int T);
/* top[i] = the top bin of binned sum s[i] (the largest term's; 0 when it
 * holds no finite nonzero term): the window for a sum of similar terms. */
void sbn_xlanes_tops(uint8_t *top, const sbn_xbin *s, size_t n);

#endif
