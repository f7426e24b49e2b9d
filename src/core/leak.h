/* Memory the library keeps on purpose until the process ends (a broken
 * MPI group's buffers, which a failed reduction may still name): marked for
 * LeakSanitizer in the ASan builds, so that it reports only real leaks. */
#ifndef SBN_CORE_LEAK_H
#define SBN_CORE_LEAK_H

#if defined(__SANITIZE_ADDRESS__)
#define SBN_LSAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SBN_LSAN 1
#endif
#endif

#ifdef SBN_LSAN
#include <sanitizer/lsan_interface.h>
/* p and everything reachable from it count as reachable. */
static inline void sbn_keep_on_purpose(const void *p) {
  if (p) __lsan_ignore_object(p);
}
#else
static inline void sbn_keep_on_purpose(const void *p) { (void)p; }
#endif

#endif
