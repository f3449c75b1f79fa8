// MemberAgent: a process's part in a job, and the one place that speaks
// membership with the coordinator. It registers (retrying while the
// coordinator is unreachable, the job is still forming, a worker's rank is
// still held by its previous incarnation, or a server stands by for a shard
// the job has not scaled to), heartbeats (the pace, each call's deadline,
// the silence since the coordinator last answered) and reports a worker's
// end (WorkerDone). grps-server and grps-worker each hold one; nothing else
// in grps calls DefineModel, RegisterServer, RegisterWorker, Heartbeat,
// WorkerDone, LeaseExamples or Collective.
//
// The holder says what a heartbeat carries and does what a reply says (the
// live set, a restore order, a checkpoint request, the end of the job): the
// agent knows nothing of shards or training.
//
//   MemberAgent agent(stub, {job, MemberKind::kWorker, rank, incarnation},
//                     interval, call_timeout);
//   agent.Start({fill, on_reply, on_error});   // a thread of its own
//   ... agent.Silence() ...                    // any thread
//   agent.Stop();
//
// Every wait is bounded: registration by RegisterOptions::patience, each
// call by its deadline; a holder gives up on a silent coordinator by
// comparing Silence() with the job's coordinator_timeout_ms.
//
// Thread safety: Beat, WorkerDone, Silence and Stop may be called from any
// thread. Run or Start is called once. *coordinator must outlive the agent.
#ifndef GRPS_MEMBER_MEMBER_AGENT_H_
#define GRPS_MEMBER_MEMBER_AGENT_H_

#include <cstdint>
#include <functional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "daemon/security.h"
#include "grpcpp/grpcpp.h"
#include "proto/grps.grpc.pb.h"

namespace grps {

// How a registration is retried: while the coordinator is unreachable
// (UNAVAILABLE), an attempt outlived its deadline (the coordinator holds a
// worker's registration until every shard has registered) or the rank is
// still alive (ALREADY_EXISTS), with exponential backoff up to max_backoff,
// for at most `patience`; CANCELLED once SIGINT/SIGTERM arrived.
// How long a member keeps registering, unless told otherwise: the
// binaries' --register_timeout_s (member_flags.h) and the Python package's
// register_timeout_s.
inline constexpr absl::Duration kRegisterTimeout = absl::Seconds(120);

struct RegisterOptions {
  absl::Duration patience = kRegisterTimeout;
  absl::Duration attempt_timeout = absl::Seconds(10);
  absl::Duration max_backoff = absl::Seconds(1);
  // RESOURCE_EXHAUSTED retried too (a model offer that met the
  // coordinator's memory limit for calls); a registration's means every
  // rank or shard is taken, and is final.
  bool retry_resource_exhausted = false;
  // Servers of a job whose servers scale (JobConfig.max_servers): the
  // coordinator answers a server for a shard its map does not have yet
  // UNAVAILABLE "standby: ..." until the job scales to include the shard.
  // When set, such answers are waited through without a time limit: asked
  // again every kStandbyPace, patience starting again after each (the
  // coordinator did answer), and this is called with the first one (for
  // the holder to say so). Unset: they count as a coordinator not ready.
  std::function<void(const absl::Status& standby)> on_standby;
};

// How often a standby server asks again (RegisterOptions::on_standby).
inline constexpr absl::Duration kStandbyPace = absl::Seconds(1);

// A worker's registration: for job `job_id` (empty: the coordinator's),
// asking for `rank` (negative: any), from `host` (empty: this host's name),
// training on `backend`. grps-worker's and the Python package's alike.
v1::RegisterWorkerRequest WorkerRegistration(const std::string& job_id, int rank,
                                             std::string host, const std::string& backend);

// The coordinator's answer. On giving up, UNAVAILABLE ("not registered
// within <patience>; last: <what the last attempt met>", which says whether
// the coordinator answered, and what) or the last refusal.
absl::StatusOr<v1::RegisterWorkerResponse> RegisterWorker(
    v1::Coordinator::StubInterface* coordinator, const v1::RegisterWorkerRequest& request,
    const RegisterOptions& options);
absl::StatusOr<v1::RegisterServerResponse> RegisterServer(
    v1::Coordinator::StubInterface* coordinator, const v1::RegisterServerRequest& request,
    const RegisterOptions& options);
// A user model's offer (before its worker registers), retried as a
// registration is; on giving up, UNAVAILABLE ("not answered within ...").
absl::StatusOr<v1::DefineModelResponse> DefineModel(v1::Coordinator::StubInterface* coordinator,
                                                    const v1::DefineModelRequest& request,
                                                    const RegisterOptions& options);

class MemberAgent {
 public:
  using Clock = std::function<absl::Time()>;

  // The member a registration made; every heartbeat names it.
  struct Identity {
    std::string job_id;
    MemberKind kind = MemberKind::kWorker;
    uint32_t index = 0;  // rank or shard
    uint64_t incarnation = 0;
  };

  // What a heartbeat handler says: go on beating, or end the loop.
  enum class Next { kGoOn, kStop };
  // Each may be empty (nothing to add; go on).
  struct Handlers {
    // Adds the holder's fields (progress, shard status, generation, ...).
    std::function<void(v1::HeartbeatRequest*)> fill;
    std::function<Next(const v1::HeartbeatResponse&)> on_reply;
    std::function<Next(const grpc::Status&)> on_error;
  };

  // `interval`: the job's heartbeat interval; `call_timeout`: each
  // heartbeat's deadline. `clock` measures Silence (tests drive it); the
  // pace is real time.
  MemberAgent(v1::Coordinator::StubInterface* coordinator, Identity identity,
              absl::Duration interval, absl::Duration call_timeout,
              Clock clock = &absl::Now);
  ~MemberAgent();  // Stop()

  MemberAgent(const MemberAgent&) = delete;
  MemberAgent& operator=(const MemberAgent&) = delete;

  // One heartbeat now: `request` carries the holder's fields, the agent
  // sets the job, the member and its incarnation. An answer resets Silence
  // to the time the call was sent.
  grpc::Status Beat(v1::HeartbeatRequest request, v1::HeartbeatResponse* response)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The same with a deadline of its own (a last report on the way out).
  grpc::Status Beat(v1::HeartbeatRequest request, v1::HeartbeatResponse* response,
                    absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu_);

  // Heartbeats on the calling thread, every interval (sooner when a reply
  // asks, next_heartbeat_ms), until a handler says kStop, Stop() is called
  // or SIGINT/SIGTERM arrives.
  void Run(const Handlers& handlers) ABSL_LOCKS_EXCLUDED(mu_);
  // The same on a thread of the agent's own, which a signal does not stop
  // (the holder decides what a signal means, and calls Stop()).
  void Start(Handlers handlers) ABSL_LOCKS_EXCLUDED(mu_);
  // Ends the loop at once, cancelling its heartbeat in flight (joins
  // Start's thread). Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  // How long since the last heartbeat the coordinator answered was sent (or
  // since the agent was made).
  absl::Duration Silence() const ABSL_LOCKS_EXCLUDED(mu_);

  // A worker's WorkerDone: the agent sets the job, the rank and the
  // incarnation. The holder decides what to retry (it depends on its state).
  grpc::Status WorkerDone(v1::WorkerDoneRequest request, v1::WorkerDoneResponse* response,
                          absl::Duration timeout);
  // The same for an elastic job's LeaseExamples.
  grpc::Status LeaseExamples(v1::LeaseExamplesRequest request,
                             v1::LeaseExamplesResponse* response, absl::Duration timeout);
  // The same for a collective's contribution or result (Coordinator.Collective).
  grpc::Status Collective(v1::CollectiveRequest request, v1::CollectiveResponse* response,
                          absl::Duration timeout);

  const Identity& identity() const { return identity_; }
  v1::Coordinator::StubInterface* coordinator() const { return coordinator_; }

 private:
  void Loop(const Handlers& handlers, bool obey_signals) ABSL_LOCKS_EXCLUDED(mu_);
  // Beat's call, on `context` (the loop's can be cancelled by Stop).
  grpc::Status Call(v1::HeartbeatRequest request, v1::HeartbeatResponse* response,
                    absl::Duration timeout, grpc::ClientContext* context) ABSL_LOCKS_EXCLUDED(mu_);

  v1::Coordinator::StubInterface* const coordinator_;
  const Identity identity_;
  const absl::Duration interval_;
  const absl::Duration call_timeout_;
  const Clock clock_;

  mutable absl::Mutex mu_;
  absl::Time last_answer_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  // The loop's heartbeat while it is in flight (Stop cancels it).
  grpc::ClientContext* loop_call_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::thread thread_;  // Start's; joined by Stop
};

}  // namespace grps

#endif  // GRPS_MEMBER_MEMBER_AGENT_H_
