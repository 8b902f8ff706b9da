// Three assert levels (style note 7). None of them is for bad input: bad input gets a
// UsageError and changes nothing. These catch the allocator's own bugs.
//   CACHET_CHECK(c)            always on; prints the condition and aborts.
//   CACHET_ASSERT(c)           on unless NDEBUG (debug builds).
//   CACHET_ASSERT_EXPENSIVE(c) on only with CACHET_EXPENSIVE_CHECKS (props and fuzz builds):
//                              O(n) walks such as invariants().
#pragma once

#include <cstdio>
#include <cstdlib>

#define CACHET_CHECK(cond)                                                                  \
  do {                                                                                      \
    if (!(cond)) {                                                                          \
      std::fprintf(stderr, "cachet: internal check failed: %s (%s:%d)\n", #cond, __FILE__, \
                   __LINE__);                                                               \
      std::abort();                                                                         \
    }                                                                                       \
  } while (0)

#ifndef NDEBUG
#define CACHET_ASSERT(cond) CACHET_CHECK(cond)
#else
#define CACHET_ASSERT(cond) \
  do {                      \
  } while (0)
#endif

#ifdef CACHET_EXPENSIVE_CHECKS
#define CACHET_ASSERT_EXPENSIVE(cond) CACHET_CHECK(cond)
#else
#define CACHET_ASSERT_EXPENSIVE(cond) \
  do {                                \
  } while (0)
#endif
