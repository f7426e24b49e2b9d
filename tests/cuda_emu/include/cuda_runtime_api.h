/* The CPU emulation of CUDA stands in for this header (cuda_emu.h). */
#include "../cuda_emu.h"
