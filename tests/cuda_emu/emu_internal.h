/* What the two halves of the CPU emulation of CUDA share: the runtime
 * (cuda_emu.cpp: memory, streams, the API) and the kernel executor
 * (emu_kernels.cpp: fibers, barriers, launches). Tests only. */
#ifndef SBN_CUDA_EMU_INTERNAL_H
#define SBN_CUDA_EMU_INTERNAL_H

#include "cuda_emu.h"

namespace sbn_emu {
/* The calling thread's error for cudaGetLastError; returns e. */
cudaError_t set_last_error(cudaError_t e);
/* A failed launch: every later wait reports it, as CUDA's sticky errors. */
void set_sticky_error(cudaError_t e);
} /* namespace sbn_emu */

#endif
