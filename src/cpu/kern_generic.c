/* The kernels for any CPU: the vector code of kern_body.inc compiled for the
 * baseline target (SSE2 on x86-64), float16 converted in software. */
#include <string.h>

#include "cpu_kern.h"
#include "vec.h"

#define ISA generic
#define TABLE sbn_ktab_generic
#include "kern_instances.inc"
