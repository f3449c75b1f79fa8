// Silences the libraries' own logging in a fuzz target. Protobuf logs a line
// each time it parses a string field that is not UTF-8, and the
// coordinator's handlers one per registration or death: over millions of
// inputs the target would mostly print, and run at the speed of its output.
// Call once, before the first input.
#ifndef GRPS_FUZZ_QUIET_LOGS_H_
#define GRPS_FUZZ_QUIET_LOGS_H_

#include "google/protobuf/stubs/logging.h"
#include "spdlog/spdlog.h"

namespace grps {

inline void QuietLogs() {
  google::protobuf::SetLogHandler(nullptr);
  spdlog::set_level(spdlog::level::off);
}

}  // namespace grps

#endif  // GRPS_FUZZ_QUIET_LOGS_H_
