#include "member/member_agent.h"

#include <unistd.h>

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "daemon/daemon.h"
#include "spdlog/spdlog.h"

namespace grps {
namespace {

// How often a sleeping loop looks at Stop() and the signals.
constexpr absl::Duration kSleepSlice = absl::Milliseconds(20);

// How often a registration that keeps failing says so.
constexpr absl::Duration kSayAgainAfter = absl::Seconds(10);

// What a registration has said so far, across its rounds: each thing once,
// or (the coordinator not reachable) on the first failure and every
// kSayAgainAfter.
struct RegisterLog {
  int failures = 0;
  absl::Time say_again = absl::InfinitePast();
  bool said_taken = false;
  bool said_standby = false;
};

// The coordinator's "not yet" to a server for a shard its map does not have
// yet (RegisterOptions::on_standby).
bool IsStandbyAnswer(const absl::Status& s) {
  return absl::IsUnavailable(s) && absl::StartsWith(s.message(), "standby:");
}

template <typename Response>
using RegisterAttempt = std::function<grpc::Status(grpc::ClientContext*, Response*)>;

// One round of registration attempts, as RegisterOptions says, for at most
// its patience from now. With on_standby set, a standby answer ends the
// round at once: OK with *standby set.
template <typename Response>
absl::Status RegisterRound(const RegisterOptions& options,
                           const RegisterAttempt<Response>& attempt, Response* response,
                           RegisterLog* log, bool* standby) {
  Backoff policy;
  policy.max = options.max_backoff;
  policy.give_up_after = options.patience;
  policy.retry_deadline_exceeded = true;  // the job may still be forming
  policy.retry_resource_exhausted = options.retry_resource_exhausted;
  // A worker's rank whose previous incarnation (a process this one
  // replaces, or a reply that was lost) still counts as alive, until the
  // coordinator declares it dead.
  policy.retry_already_exists = true;
  const absl::Time give_up = absl::Now() + options.patience;
  *standby = false;
  return RetryTransient(policy, [&] {
    grpc::ClientContext context;
    context.set_deadline(
        absl::ToChronoTime(std::min(give_up, absl::Now() + options.attempt_timeout)));
    // After a refusal the channel stays in TRANSIENT_FAILURE until a
    // connection is made, and gRPC makes the next one only while a call waits
    // on the channel in this process: retries that failed fast saw the first
    // refusal for 10 s after the coordinator came up. The first attempt fails
    // fast, so that an unreachable coordinator is said at once, with its reason.
    context.set_wait_for_ready(log->failures > 0);
    absl::Status s = ToAbsl(attempt(&context, response));
    if (options.on_standby && IsStandbyAnswer(s)) {
      if (!log->said_standby) options.on_standby(s);
      log->said_standby = true;
      *standby = true;
      return absl::OkStatus();  // the round ends; the caller starts another
    }
    if (absl::IsAlreadyExists(s)) {
      if (!log->said_taken) spdlog::info("waiting for our rank: {}", std::string(s.message()));
      log->said_taken = true;
    } else if (!s.ok()) {
      ++log->failures;
      if (absl::Now() >= log->say_again) {
        spdlog::warn("not registered yet ({}{}); retrying", std::string(s.message()),
                     TlsHint(s.message(), ProcessSecurity()));
        log->say_again = absl::Now() + kSayAgainAfter;
      }
    }
    return s;
  });
}

// Calls `attempt` (one registration, given its deadline) as RegisterOptions
// says: rounds of RegisterRound, one after another while the coordinator
// answers that the server stands by.
template <typename Response>
absl::StatusOr<Response> RegisterWithRetries(const RegisterOptions& options,
                                             const RegisterAttempt<Response>& attempt,
                                             absl::string_view what = "registered") {
  Response response;
  RegisterLog log;
  bool standby = false;
  absl::Status status = RegisterRound(options, attempt, &response, &log, &standby);
  while (status.ok() && standby) {
    SleepUnlessShutdown(kStandbyPace);
    if (ShutdownRequested()) return absl::CancelledError("signal received");
    status = RegisterRound(options, attempt, &response, &log, &standby);
  }
  if (status.ok()) return response;
  // Unreachable, or reached and not ready (a worker's registration is held
  // until every shard has registered; a server's is answered "not yet"):
  // the last attempt's status says which.
  if (absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status))
    return absl::UnavailableError(absl::StrCat(
        "not ", what, " within ", absl::FormatDuration(options.patience), "; last: ",
        absl::IsDeadlineExceeded(status)
            ? "no answer within the attempt's deadline (the coordinator unreachable, or "
              "holding the registration until the job can take it)"
            : std::string(status.message())));
  return status;
}

}  // namespace

v1::RegisterWorkerRequest WorkerRegistration(const std::string& job_id, int rank,
                                             std::string host, const std::string& backend) {
  v1::RegisterWorkerRequest request;
  request.set_job_id(job_id);
  if (rank >= 0) request.set_requested_rank(rank);
  if (host.empty()) {
    char name[256] = "localhost";
    gethostname(name, sizeof(name) - 1);
    host = name;
  }
  request.set_host(host);
  request.set_backend(backend);
  return request;
}

absl::StatusOr<v1::RegisterWorkerResponse> RegisterWorker(
    v1::Coordinator::StubInterface* coordinator, const v1::RegisterWorkerRequest& request,
    const RegisterOptions& options) {
  return RegisterWithRetries<v1::RegisterWorkerResponse>(
      options, [&](grpc::ClientContext* context, v1::RegisterWorkerResponse* response) {
        return coordinator->RegisterWorker(context, request, response);
      });
}

absl::StatusOr<v1::DefineModelResponse> DefineModel(v1::Coordinator::StubInterface* coordinator,
                                                    const v1::DefineModelRequest& request,
                                                    const RegisterOptions& options) {
  return RegisterWithRetries<v1::DefineModelResponse>(
      options,
      [&](grpc::ClientContext* context, v1::DefineModelResponse* response) {
        return coordinator->DefineModel(context, request, response);
      },
      "answered");
}

absl::StatusOr<v1::RegisterServerResponse> RegisterServer(
    v1::Coordinator::StubInterface* coordinator, const v1::RegisterServerRequest& request,
    const RegisterOptions& options) {
  return RegisterWithRetries<v1::RegisterServerResponse>(
      options, [&](grpc::ClientContext* context, v1::RegisterServerResponse* response) {
        return coordinator->RegisterServer(context, request, response);
      });
}

MemberAgent::MemberAgent(v1::Coordinator::StubInterface* coordinator, Identity identity,
                         absl::Duration interval, absl::Duration call_timeout, Clock clock)
    : coordinator_(coordinator),
      identity_(std::move(identity)),
      interval_(interval),
      call_timeout_(call_timeout),
      clock_(std::move(clock)),
      last_answer_(clock_()) {}

MemberAgent::~MemberAgent() { Stop(); }

grpc::Status MemberAgent::Beat(v1::HeartbeatRequest request,
                               v1::HeartbeatResponse* response) {
  return Beat(std::move(request), response, call_timeout_);
}

grpc::Status MemberAgent::Beat(v1::HeartbeatRequest request, v1::HeartbeatResponse* response,
                               absl::Duration timeout) {
  grpc::ClientContext context;
  return Call(std::move(request), response, timeout, &context);
}

grpc::Status MemberAgent::Call(v1::HeartbeatRequest request, v1::HeartbeatResponse* response,
                               absl::Duration timeout, grpc::ClientContext* context) {
  request.set_job_id(identity_.job_id);
  if (identity_.kind == MemberKind::kWorker)
    request.set_worker_rank(identity_.index);
  else
    request.set_server_shard(identity_.index);
  request.set_incarnation(identity_.incarnation);
  context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  // Waits for a connection (see RegisterWithRetries): a coordinator that
  // comes back is heard as soon as it listens.
  context->set_wait_for_ready(true);
  // Silence counts from when the answered call was sent: an answer that
  // took long does not hide the time it took, and one that arrives after
  // the coordinator went quiet cannot move the last answer past the quiet.
  const absl::Time sent = clock_();
  grpc::Status status = coordinator_->Heartbeat(context, request, response);
  if (status.ok()) {
    absl::MutexLock lock(&mu_);
    last_answer_ = std::max(last_answer_, sent);
  }
  return status;
}

void MemberAgent::Run(const Handlers& handlers) { Loop(handlers, /*obey_signals=*/true); }

void MemberAgent::Start(Handlers handlers) {
  thread_ = std::thread([this, handlers = std::move(handlers)] {
    Loop(handlers, /*obey_signals=*/false);
  });
}

void MemberAgent::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    // The loop's heartbeat in flight ends now, not at its deadline (a
    // coordinator that has exited would hold it there: every member's
    // exit at the end of a job would wait for it).
    if (loop_call_ != nullptr) loop_call_->TryCancel();
  }
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

absl::Duration MemberAgent::Silence() const {
  absl::MutexLock lock(&mu_);
  return clock_() - last_answer_;
}

namespace {

// A worker's request to the coordinator, stamped with who sends it.
template <typename Request>
void StampWorker(const MemberAgent::Identity& identity, Request* request) {
  request->set_job_id(identity.job_id);
  request->set_worker_rank(identity.index);
  request->set_incarnation(identity.incarnation);
}

// One call of a worker's request, stamped, with a deadline `timeout` away.
template <typename Request, typename Response>
grpc::Status CallAsWorker(
    v1::Coordinator::StubInterface* coordinator, const MemberAgent::Identity& identity,
    grpc::Status (v1::Coordinator::StubInterface::*method)(grpc::ClientContext*,
                                                            const Request&, Response*),
    Request request, Response* response, absl::Duration timeout) {
  StampWorker(identity, &request);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  return (coordinator->*method)(&context, request, response);
}

}  // namespace

grpc::Status MemberAgent::WorkerDone(v1::WorkerDoneRequest request,
                                     v1::WorkerDoneResponse* response,
                                     absl::Duration timeout) {
  return CallAsWorker(coordinator_, identity_, &v1::Coordinator::StubInterface::WorkerDone,
                      std::move(request), response, timeout);
}

grpc::Status MemberAgent::LeaseExamples(v1::LeaseExamplesRequest request,
                                        v1::LeaseExamplesResponse* response,
                                        absl::Duration timeout) {
  return CallAsWorker(coordinator_, identity_, &v1::Coordinator::StubInterface::LeaseExamples,
                      std::move(request), response, timeout);
}

grpc::Status MemberAgent::Collective(v1::CollectiveRequest request,
                                     v1::CollectiveResponse* response, absl::Duration timeout) {
  return CallAsWorker(coordinator_, identity_, &v1::Coordinator::StubInterface::Collective,
                      std::move(request), response, timeout);
}

void MemberAgent::Loop(const Handlers& handlers, bool obey_signals) {
  auto stopping = [&] {
    absl::MutexLock lock(&mu_);
    return stop_ || (obey_signals && ShutdownRequested());
  };
  while (!stopping()) {
    const absl::Time tick = absl::Now();
    v1::HeartbeatRequest request;
    if (handlers.fill) handlers.fill(&request);
    v1::HeartbeatResponse response;
    grpc::ClientContext context;
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return;
      loop_call_ = &context;
    }
    const grpc::Status status = Call(std::move(request), &response, call_timeout_, &context);
    {
      absl::MutexLock lock(&mu_);
      loop_call_ = nullptr;
      if (stop_) return;  // cancelled, or answered after the holder stopped listening
    }
    Next next = Next::kGoOn;
    if (status.ok() && handlers.on_reply) next = handlers.on_reply(response);
    if (!status.ok() && handlers.on_error) next = handlers.on_error(status);
    if (next == Next::kStop) return;
    // Sooner while the job is ending, when the coordinator asks.
    absl::Duration pace = interval_;
    if (status.ok() && response.next_heartbeat_ms() > 0)
      pace = std::min(pace, absl::Milliseconds(response.next_heartbeat_ms()));
    const absl::Time due = tick + pace;
    absl::MutexLock lock(&mu_);
    for (absl::Time now = absl::Now(); now < due && !stop_; now = absl::Now()) {
      if (obey_signals && ShutdownRequested()) break;
      mu_.AwaitWithTimeout(absl::Condition(&stop_), std::min(due - now, kSleepSlice));
    }
  }
}

}  // namespace grps
