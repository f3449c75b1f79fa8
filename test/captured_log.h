// What the default spdlog logger writes while a CapturedLog lives, in lines:
// a test's view of what a daemon or client says.
//
//   CapturedLog log;
//   DoSomethingThatWarns();
//   EXPECT_THAT(log.Lines(), Contains(HasSubstr("refused")));
#ifndef GRPS_TEST_CAPTURED_LOG_H_
#define GRPS_TEST_CAPTURED_LOG_H_

#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "spdlog/sinks/ostream_sink.h"
#include "spdlog/spdlog.h"

namespace grps {

class CapturedLog {
 public:
  CapturedLog() : previous_(spdlog::default_logger()) {
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(out_);
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("test", sink));
  }
  CapturedLog(const CapturedLog&) = delete;
  CapturedLog& operator=(const CapturedLog&) = delete;
  ~CapturedLog() { spdlog::set_default_logger(previous_); }

  std::vector<std::string> Lines() {
    spdlog::default_logger()->flush();
    std::vector<std::string> lines;
    for (absl::string_view line : absl::StrSplit(out_.str(), '\n', absl::SkipEmpty()))
      lines.emplace_back(line);
    return lines;
  }

 private:
  std::ostringstream out_;
  std::shared_ptr<spdlog::logger> previous_;
};

}  // namespace grps

#endif  // GRPS_TEST_CAPTURED_LOG_H_
