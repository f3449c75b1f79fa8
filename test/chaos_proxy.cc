#include "test/chaos_proxy.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "daemon/daemon.h"

namespace grps {
namespace {

// How long a delayed second copy may take at the backend.
constexpr absl::Duration kEchoDeadline = absl::Seconds(5);

absl::Status CheckProbability(const char* name, double p) {
  if (!(p >= 0.0 && p <= 1.0))
    return absl::InvalidArgumentError(
        absl::StrCat(name, " must be a probability in [0, 1], got ", p));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<ChaosProxy>> ChaosProxy::Create(
    Options options) {
  if (options.backend.empty())
    return absl::InvalidArgumentError("chaos proxy: no backend address");
  for (const auto& [name, p] :
       {std::pair{"drop_request", options.drop_request},
        std::pair{"drop_reply", options.drop_reply}, std::pair{"duplicate", options.duplicate},
        std::pair{"drop_pull_request", options.drop_pull_request},
        std::pair{"drop_pull_reply", options.drop_pull_reply}}) {
    if (absl::Status s = CheckProbability(name, p); !s.ok()) return s;
  }
  return std::unique_ptr<ChaosProxy>(new ChaosProxy(std::move(options)));
}

ChaosProxy::ChaosProxy(Options options)
    : options_(std::move(options)),
      stub_(v1::ParameterServer::NewStub(MakeChannel(options_.backend))),
      rng_(options_.seed),
      pull_rng_(options_.seed ^ 0x9e3779b97f4a7c15ULL) {
  echo_thread_ = std::thread([this] { EchoLoop(); });
}

ChaosProxy::~ChaosProxy() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    echo_added_.SignalAll();
  }
  echo_thread_.join();
}

ChaosProxy::Counters ChaosProxy::counters() const {
  absl::MutexLock lock(&mu_);
  return counters_;
}

void ChaosProxy::CountCall() {
  absl::MutexLock lock(&mu_);
  ++counters_.calls;
}

ChaosProxy::Decision ChaosProxy::Decide() {
  absl::MutexLock lock(&mu_);
  ++counters_.calls;
  ++counters_.pushes;
  // Always five draws, whatever is decided, so that the decisions of later
  // pushes depend only on the seed and the order of arrival.
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::uniform_int_distribution<uint32_t> ms(0, options_.max_delay_ms);
  const double drop_request = unit(rng_);
  const double drop_reply = unit(rng_);
  const double duplicate = unit(rng_);
  const uint32_t delay_ms = ms(rng_);
  const uint32_t duplicate_delay_ms = ms(rng_);

  Decision d;
  d.delay = absl::Milliseconds(delay_ms);
  if (delay_ms > 0) ++counters_.delayed;
  // Runs here, under mu_; the analysis does not see that through a lambda.
  auto fault = [&](double draw, double p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (draw >= p || counters_.faults >= options_.max_faults) return false;
    ++counters_.faults;
    return true;
  };
  if (fault(drop_request, options_.drop_request)) {
    d.drop_request = true;
    ++counters_.dropped_requests;
    return d;
  }
  if (fault(drop_reply, options_.drop_reply)) {
    d.drop_reply = true;
    ++counters_.dropped_replies;
  }
  if (fault(duplicate, options_.duplicate)) {
    d.duplicate = true;
    d.duplicate_delay = absl::Milliseconds(duplicate_delay_ms);
  }
  return d;
}

ChaosProxy::PullDecision ChaosProxy::DecidePull() {
  absl::MutexLock lock(&mu_);
  PullDecision d;
  if (options_.drop_pull_request <= 0 && options_.drop_pull_reply <= 0) return d;
  // Always two draws, as Decide's five.
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  const double drop_request = unit(pull_rng_);
  const double drop_reply = unit(pull_rng_);
  if (drop_request < options_.drop_pull_request &&
      counters_.dropped_pull_requests < options_.max_faults) {
    ++counters_.dropped_pull_requests;
    d.drop_request = true;
  } else if (drop_reply < options_.drop_pull_reply &&
             counters_.dropped_pull_replies < options_.max_faults) {
    d.drop_reply = true;  // counted once the shard has answered OK
  }
  return d;
}

grpc::Status ChaosProxy::DropPullReply(const grpc::Status& status, const char* what) {
  if (!status.ok()) return status;
  absl::MutexLock lock(&mu_);
  ++counters_.dropped_pull_replies;
  return grpc::Status(
      grpc::StatusCode::UNAVAILABLE,
      absl::StrCat("chaos proxy: ", what, " reply dropped after the shard served it"));
}

template <typename Request, typename Response>
grpc::Status ChaosProxy::FaultyPush(grpc::ServerContext* context, const Request& request,
                                    Response* response,
                                    grpc::Status (v1::ParameterServer::Stub::*forward)(
                                        grpc::ClientContext*, const Request&, Response*)) {
  const Decision d = Decide();
  absl::SleepFor(d.delay);
  if (d.drop_request)
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        "chaos proxy: push dropped before the shard");
  std::unique_ptr<grpc::ClientContext> forwarded =
      grpc::ClientContext::FromServerContext(*context);
  const grpc::Status status = (stub_.get()->*forward)(forwarded.get(), request, response);
  if (d.duplicate) {
    absl::MutexLock lock(&mu_);
    echoes_.push_back(Echo{absl::Now() + d.duplicate_delay,
                           [this, forward, copy = request](grpc::ClientContext* c) {
                             Response ignored;
                             (void)(stub_.get()->*forward)(c, copy, &ignored);
                           }});
    echo_added_.Signal();
  }
  if (d.drop_reply) {  // whatever the shard said, the client never hears it
    response->Clear();
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        "chaos proxy: the shard's reply was dropped");
  }
  return status;
}

grpc::Status ChaosProxy::Push(grpc::ServerContext* context,
                              const v1::PushRequest* request,
                              v1::PushResponse* response) {
  return FaultyPush(context, *request, response, &v1::ParameterServer::Stub::Push);
}

void ChaosProxy::EchoLoop() {
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    if (echoes_.empty()) {
      echo_added_.Wait(&mu_);
      continue;
    }
    auto next = std::min_element(
        echoes_.begin(), echoes_.end(),
        [](const Echo& a, const Echo& b) { return a.due < b.due; });
    if (next->due > absl::Now()) {
      echo_added_.WaitWithDeadline(&mu_, next->due);
      continue;  // re-examine: a sooner echo may have come, or stopping_
    }
    std::function<void(grpc::ClientContext*)> send = std::move(next->send);
    echoes_.erase(next);
    mu_.Unlock();
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + kEchoDeadline));
    // The outcome does not matter: the client already has its reply.
    send(&context);
    mu_.Lock();
    ++counters_.duplicated;  // after the call: the shard has seen it
  }
}

grpc::ServerUnaryReactor* ChaosProxy::Pull(grpc::CallbackServerContext* context,
                                           const v1::PullRequest* request,
                                           v1::PullResponse* response) {
  CountCall();
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  // Owned by the completion callback, which runs exactly once.
  const PullDecision decision = DecidePull();
  if (decision.drop_request) {
    reactor->Finish(
        grpc::Status(grpc::StatusCode::UNAVAILABLE, "chaos proxy: pull dropped before the shard"));
    return reactor;
  }
  grpc::ClientContext* forward =
      grpc::ClientContext::FromCallbackServerContext(*context).release();
  StartUnaryCall(
      [&](grpc::ClientUnaryReactor* r) { stub_->async()->Pull(forward, request, response, r); },
      [this, reactor, forward, response, drop_reply = decision.drop_reply](grpc::Status status) {
        delete forward;
        if (drop_reply) {
          status = DropPullReply(status, "pull");
          response->Clear();
        }
        reactor->Finish(status);
      });
  return reactor;
}

grpc::Status ChaosProxy::PushSparse(grpc::ServerContext* context,
                                    const v1::SparsePushRequest* request,
                                    v1::SparsePushResponse* response) {
  return FaultyPush(context, *request, response, &v1::ParameterServer::Stub::PushSparse);
}

grpc::Status ChaosProxy::PullSparse(grpc::ServerContext* context,
                                    const v1::SparsePullRequest* request,
                                    v1::SparsePullResponse* response) {
  CountCall();
  const PullDecision decision = DecidePull();
  if (decision.drop_request)
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        "chaos proxy: sparse pull dropped before the shard");
  std::unique_ptr<grpc::ClientContext> forward =
      grpc::ClientContext::FromServerContext(*context);
  const grpc::Status status = stub_->PullSparse(forward.get(), *request, response);
  if (!decision.drop_reply) return status;
  response->Clear();
  return DropPullReply(status, "sparse pull");
}

grpc::Status ChaosProxy::GetShardStatus(grpc::ServerContext* context,
                                        const v1::GetShardStatusRequest* request,
                                        v1::ShardStatus* response) {
  CountCall();
  std::unique_ptr<grpc::ClientContext> forward =
      grpc::ClientContext::FromServerContext(*context);
  return stub_->GetShardStatus(forward.get(), *request, response);
}

}  // namespace grps
