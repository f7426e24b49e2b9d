/* Internal: the module layer's one entry to BLAS (OpenBLAS). */
#ifndef SBN_NN_BLAS_H
#define SBN_NN_BLAS_H

#include <cblas.h>

/* cblas_sgemm, after giving OpenBLAS the thread count of this rank (blas.c). */
void sbn_nn_sgemm(enum CBLAS_ORDER order, enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int m, int n,
                  int k, float alpha, const float *a, int lda, const float *b, int ldb, float beta, float *c,
                  int ldc);
/* The OpenBLAS thread count the library sets before its GEMMs now. */
int sbn_nn_blas_threads(void);

#endif
