// The failure counter and CHECK macro of the host C++ tests (tests/blocked.rs puts this file in
// front of each program's source).
#include <cstdio>

static int failures = 0;

#define CHECK(cond, ...)                                                  \
  do {                                                                    \
    if (!(cond)) {                                                        \
      if (failures++ < 20) {                                              \
        std::printf("FAIL line %d: %s: ", __LINE__, #cond);               \
        std::printf(__VA_ARGS__);                                         \
        std::printf("\n");                                                \
      }                                                                   \
    }                                                                     \
  } while (0)
