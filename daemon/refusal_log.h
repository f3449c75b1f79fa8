// Refused requests, logged without letting a client flood the log: one
// warning per kind (method and status code) at most every `every`; the
// refusals in between are counted and said in the next warning of their
// kind. Every gRPC server of daemon.h logs its refusals here (through a
// server interceptor), and so does the token check of security.cc.
#ifndef GRPS_DAEMON_REFUSAL_LOG_H_
#define GRPS_DAEMON_REFUSAL_LOG_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/support/server_interceptor.h"
#include "grpcpp/support/status.h"

namespace grps {

// Whether a call that ended with `code` was refused: bad input, no right,
// no room. Not the ends that are no fault of the caller's request
// (CANCELLED, DEADLINE_EXCEEDED, UNAVAILABLE, ABORTED: a roll-back).
bool IsRefusal(grpc::StatusCode code);

class RefusalLog {
 public:
  static constexpr absl::Duration kEvery = absl::Seconds(10);
  // Kinds kept apart; beyond, refusals share one kind ("other").
  static constexpr size_t kMaxKinds = 64;

  explicit RefusalLog(absl::Duration every = kEvery,
                      std::function<absl::Time()> now = absl::Now);

  // The one every server of this process logs to.
  static RefusalLog& Process();

  // Notes a refused call of `method` from `peer` (both as the caller sent
  // them: quoted before they are logged) and logs a warning unless one of
  // its kind went out within `every`. Returns whether it logged.
  bool Note(absl::string_view method, grpc::StatusCode code,
            absl::string_view peer, absl::string_view message);

 private:
  struct Kind {
    absl::Time logged;
    uint64_t unsaid = 0;  // refused since `logged`, not logged
  };
  const absl::Duration every_;
  const std::function<absl::Time()> now_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, Kind> kinds_ ABSL_GUARDED_BY(mu_);
};

// A server interceptor factory that notes every refused call in
// RefusalLog::Process().
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
MakeRefusalLogInterceptorFactory();

}  // namespace grps

#endif  // GRPS_DAEMON_REFUSAL_LOG_H_
