// ChaosProxy: a grps.v1.ParameterServer that stands between workers and one
// real shard and makes the network between them unreliable. Every call is
// forwarded to the backend shard; pushes (dense and sparse alike) are where
// the faults are:
//
//   drop_request  the push is not forwarded; the client gets UNAVAILABLE.
//   drop_reply    the push is forwarded (and applied), but the client gets
//                 UNAVAILABLE whatever the shard answered, so it retries:
//                 the shard sees a duplicate.
//   duplicate     the push is forwarded, the client gets that reply, and a
//                 second copy is sent later (after a random delay of up to
//                 max_delay_ms, from a background thread), so it may arrive
//                 after the client's next push: a stale, reordered retry.
//   max_delay_ms  every push waits a uniform 0..max_delay_ms before it is
//                 forwarded; concurrent pushes therefore reorder.
//
// Each fault has a probability. The decisions come from one RNG seeded with
// `seed` and drawn a fixed number of times per push, so they are
// deterministic given the seed and the order in which pushes arrive.
// `max_faults` caps the drops and duplicates together (delays are not
// capped: they never stop a run from finishing), so a client that retries
// always gets through in the end.
//
// Pulls (dense and sparse) and shard status are forwarded as they are (with
// the caller's deadline and cancellation); a backend that is down answers
// UNAVAILABLE through the proxy, as it would directly. Two faults for pulls
// (dense and sparse), drawn from an RNG of its own (the pushes' decisions
// stay as the seed makes them):
//
//   drop_pull_request  the pull is not forwarded; the client gets
//                      UNAVAILABLE, so it pulls again.
//   drop_pull_reply    the pull is forwarded and served (OK), but the
//                      client gets UNAVAILABLE, so it pulls the same clock
//                      again from a shard that has already served it (in
//                      ssp the shard must answer the same values:
//                      docs/consistency.md).
//
// Thread safety: gRPC calls the handlers from many threads; counters() may
// be called from any thread. The proxy must outlive the gRPC server that
// serves it (shut the server down first); the destructor stops the
// background thread and drops the second copies not yet sent.
#ifndef GRPS_TEST_CHAOS_PROXY_H_
#define GRPS_TEST_CHAOS_PROXY_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/grps.grpc.pb.h"

namespace grps {

class ChaosProxy final : public v1::ParameterServer::WithCallbackMethod_Pull<
                             v1::ParameterServer::Service> {
 public:
  struct Options {
    std::string backend;  // "host:port" of the real shard
    uint64_t seed = 1;
    double drop_request = 0;  // probabilities in [0, 1]
    double drop_reply = 0;
    double duplicate = 0;
    double drop_pull_request = 0;
    double drop_pull_reply = 0;
    uint32_t max_delay_ms = 0;
    uint64_t max_faults = 1000;  // drops and duplicates, all together
  };

  struct Counters {
    uint64_t calls = 0;   // every RPC received (pushes, pulls, status, ...)
    uint64_t pushes = 0;  // Push and PushSparse RPCs received
    uint64_t dropped_requests = 0;
    uint64_t dropped_replies = 0;
    uint64_t duplicated = 0;  // second copies sent (their calls returned)
    uint64_t delayed = 0;     // pushes held back by a non-zero delay
    // Not among `faults`; each capped by max_faults too.
    uint64_t dropped_pull_requests = 0;
    uint64_t dropped_pull_replies = 0;
    // Faults (drops and duplicates) decided so far; at max_faults they
    // stop. Duplicates decided but not yet sent: faults - dropped_requests
    // - dropped_replies - duplicated.
    uint64_t faults = 0;
  };

  // Validates the options (InvalidArgument: no backend, a probability
  // outside [0, 1]) and opens a channel to the backend (lazily connected:
  // the backend need not be up yet).
  static absl::StatusOr<std::unique_ptr<ChaosProxy>> Create(Options options);

  ~ChaosProxy() override;
  ChaosProxy(const ChaosProxy&) = delete;
  ChaosProxy& operator=(const ChaosProxy&) = delete;

  Counters counters() const ABSL_LOCKS_EXCLUDED(mu_);

  grpc::Status Push(grpc::ServerContext* context,
                    const v1::PushRequest* request,
                    v1::PushResponse* response) override;
  grpc::ServerUnaryReactor* Pull(grpc::CallbackServerContext* context,
                                 const v1::PullRequest* request,
                                 v1::PullResponse* response) override;
  grpc::Status PushSparse(grpc::ServerContext* context,
                          const v1::SparsePushRequest* request,
                          v1::SparsePushResponse* response) override;
  grpc::Status PullSparse(grpc::ServerContext* context,
                          const v1::SparsePullRequest* request,
                          v1::SparsePullResponse* response) override;
  grpc::Status GetShardStatus(grpc::ServerContext* context,
                              const v1::GetShardStatusRequest* request,
                              v1::ShardStatus* response) override;

 private:
  // What happens to one push, drawn when it arrives.
  struct Decision {
    absl::Duration delay;
    bool drop_request = false;
    bool drop_reply = false;
    bool duplicate = false;
    absl::Duration duplicate_delay;
  };
  // A second copy waiting to be sent: `send` sends it (a copy of the
  // request, to the backend, with `context`).
  struct Echo {
    absl::Time due;
    std::function<void(grpc::ClientContext* context)> send;
  };
  // A push of either kind through the faults: `forward` sends the request
  // to the backend, `clear` empties the reply.
  template <typename Request, typename Response>
  grpc::Status FaultyPush(grpc::ServerContext* context, const Request& request,
                          Response* response,
                          grpc::Status (v1::ParameterServer::Stub::*forward)(
                              grpc::ClientContext*, const Request&, Response*))
      ABSL_LOCKS_EXCLUDED(mu_);

  explicit ChaosProxy(Options options);
  Decision Decide() ABSL_LOCKS_EXCLUDED(mu_);
  // What happens to one pull, drawn when it arrives (counted).
  struct PullDecision {
    bool drop_request = false;
    bool drop_reply = false;
  };
  PullDecision DecidePull() ABSL_LOCKS_EXCLUDED(mu_);
  // The status the client gets for a pull whose reply is dropped: the
  // shard's own if it failed, else UNAVAILABLE (counted).
  grpc::Status DropPullReply(const grpc::Status& status, const char* what) ABSL_LOCKS_EXCLUDED(mu_);
  void CountCall() ABSL_LOCKS_EXCLUDED(mu_);
  void EchoLoop() ABSL_LOCKS_EXCLUDED(mu_);

  const Options options_;
  const std::unique_ptr<v1::ParameterServer::Stub> stub_;

  mutable absl::Mutex mu_;
  std::mt19937_64 rng_ ABSL_GUARDED_BY(mu_);
  std::mt19937_64 pull_rng_ ABSL_GUARDED_BY(mu_);
  Counters counters_ ABSL_GUARDED_BY(mu_);
  std::vector<Echo> echoes_ ABSL_GUARDED_BY(mu_);  // unordered; few
  absl::CondVar echo_added_;  // an echo was queued, or stopping_ was set
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread echo_thread_;
};

}  // namespace grps

#endif  // GRPS_TEST_CHAOS_PROXY_H_
