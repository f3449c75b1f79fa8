// Silences the libraries' own logging in a fuzz target. Protobuf logs a line
// each time it parses a string field that is not UTF-8, and the
// coordinator's handlers one per registration or death: over millions of
// inputs the target would mostly print, and run at the speed of its output.
// Call at the start of every input: it acts on the first call only.
#ifndef GRPS_FUZZ_QUIET_LOGS_H_
#define GRPS_FUZZ_QUIET_LOGS_H_

#include "google/protobuf/stubs/logging.h"
#include "spdlog/spdlog.h"

namespace grps {

inline void QuietLogs() {
  static const bool quiet = [] {
    google::protobuf::SetLogHandler(nullptr);
    spdlog::set_level(spdlog::level::off);
    return true;
  }();
  (void)quiet;
}

}  // namespace grps

#endif  // GRPS_FUZZ_QUIET_LOGS_H_
