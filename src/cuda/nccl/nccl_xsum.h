/* Internal: the device half of the NCCL backend's exact all-reduce
 * (src/comm/nccl.c): three kernels around NCCL's two reductions, with the
 * arithmetic of src/comm/exact_sum_fixed.h.
 *
 *   sbn_nx_prepare  x -> tags: [control | one tag byte per value]
 *   ncclAllReduce   tags, uint8, MAX
 *   sbn_nx_encode   x, reduced tags -> bins: 4 int64 per value
 *   ncclAllReduce   bins, int64, SUM
 *   sbn_nx_decode   bins, reduced tags -> x (only when the control agrees)
 *
 * THE CONTROL BYTES (SBN_NX_CTRL of them, ahead of the tags) carry this
 * rank's signature into the same MAX: the 8 bytes of a 64-bit hash of the
 * signature, the 8 bytes of its complement, and the local status (0..255).
 * After the MAX, byte i of the hash part is the maximum over ranks and byte
 * i of the complement part is 255 minus the minimum, so every rank's hash
 * equals this rank's iff both parts read back unchanged; the status byte is
 * the largest status of any rank. Every rank reads the same reduced bytes,
 * so every rank reaches the same verdict.
 *
 * THE ERROR WORD. sbn_nx_decode writes no value when the verdict is bad.
 * Instead, one thread records it in `err` (host-mapped pinned memory, three
 * int64: [status, collective sequence number, largest status]) — the sequence
 * number and status are written first, then the status word with a system
 * fence, first error wins — and the group's next host-side call reports it
 * (see nccl.c). Nothing waits for the host.
 *
 * All launches go on `stream`; nothing allocates or synchronizes, so the
 * sequence can be captured in a CUDA graph. Each returns 0 or the
 * cudaError_t of the launch. */
#ifndef SBN_CUDA_NCCL_XSUM_H
#define SBN_CUDA_NCCL_XSUM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SBN_NX_CTRL 24 /* control bytes ahead of the tags */
#define SBN_NX_WORDS 4 /* int64 per value in the sum: 3 bins and the inf/NaN counts */

/* tags[0..SBN_NX_CTRL + n): control bytes, then tag(x[i]). x: n float64
 * (is_f32 = 0) or float32 values in device memory; NULL: all zero (a rank
 * with a local error sends nothing but its status). */
int sbn_nx_prepare(void *stream, uint8_t *tags, const void *x, size_t n, int is_f32,
                   uint64_t hash, int status);

/* bins[4i .. 4i+4) = fixed-top digits and inf/NaN count of x[i] against the
 * reduced tag. x NULL: zeros. */
int sbn_nx_encode(void *stream, int64_t *bins, const void *x, size_t n, int is_f32,
                  const uint8_t *tags);

/* Check the reduced control bytes against (hash, status); if all ranks
 * agree and none failed, x[i] = the decoded sum, rounded once to x's type;
 * else x is untouched and, unless this rank's own status is the failure,
 * err records SBN_STATUS_MISMATCH or SBN_STATUS_PEER_FAILED with `seq`.
 * x may be NULL (n = 0: a check only). err: device view of the error word. */
int sbn_nx_decode(void *stream, void *x, size_t n, int is_f32, const int64_t *bins,
                  const uint8_t *tags, uint64_t hash, int status, uint64_t seq, int64_t *err);

#ifdef __cplusplus
}
#endif
#endif
