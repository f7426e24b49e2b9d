/* Internal: fault injection for the group tests. Not part of the API and
 * not exported from the shared library (hidden visibility); tests reach it
 * by linking the static library. */
#ifndef SBN_GROUP_TESTHOOK_H
#define SBN_GROUP_TESTHOOK_H

#if defined(__GNUC__)
#define SBN_GROUP_HIDDEN __attribute__((visibility("hidden")))
#else
#define SBN_GROUP_HIDDEN
#endif

/* The next this many group handles made on the calling thread
 * (sbn_group_alloc: a split's or a constructor's new handle) fail as if
 * out of memory: one rank's local failure in the middle of a split. */
extern SBN_GROUP_HIDDEN _Thread_local int sbn_group_test_alloc_failures;

#endif
