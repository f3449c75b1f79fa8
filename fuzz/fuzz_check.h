// How a fuzz target states an invariant.
//
// A fuzz target may only crash for a bug. FUZZ_CHECK is how a target says
// that something the code promises did not hold (two decodings of the same
// bytes disagree, a reply the contract says is plain protobuf does not
// parse): it prints what failed and aborts, which libFuzzer reports as a
// crash and the replay binaries as a failed test. Error statuses are not
// failures: refusing bad input is what the code under test is for.
#ifndef GRPS_FUZZ_FUZZ_CHECK_H_
#define GRPS_FUZZ_FUZZ_CHECK_H_

#include <cstdio>
#include <cstdlib>
#include <string>

namespace grps {

[[noreturn]] inline void FuzzCheckFailed(const char* file, int line,
                                         const char* condition,
                                         const std::string& detail) {
  std::fprintf(stderr, "%s:%d: FUZZ_CHECK(%s) failed: %s\n", file, line,
               condition, detail.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace grps

// Aborts with `detail` (a std::string expression, evaluated only on failure)
// unless `condition` holds.
#define FUZZ_CHECK(condition, detail)                                     \
  do {                                                                    \
    if (!(condition))                                                     \
      ::grps::FuzzCheckFailed(__FILE__, __LINE__, #condition, (detail));  \
  } while (0)

#endif  // GRPS_FUZZ_FUZZ_CHECK_H_
