// JobClient: what a user links to talk to a running job. It speaks to the
// job's coordinator (the Coordinator service of proto/grps.proto) and never to
// servers or workers.
//
// Every unary call carries a deadline (rpc_timeout) and fails fast with
// UNAVAILABLE when the coordinator cannot be reached, rather than waiting for
// it to appear. Error messages name the target.
//
// Thread safety: a JobClient may be shared by threads; each call is
// independent. Watch blocks the calling thread until it returns.
#ifndef GRPS_CLIENT_JOB_CLIENT_H_
#define GRPS_CLIENT_JOB_CLIENT_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "proto/grps.grpc.pb.h"
#include "proto/grps.pb.h"

namespace grps {

// True for the states a job never leaves: completed, failed, stopped.
bool JobEnded(v1::JobState state);

class JobClient {
 public:
  // `target` is the coordinator's "host:port".
  explicit JobClient(const std::string& target,
                     absl::Duration rpc_timeout = absl::Seconds(5));
  // Talks over an existing channel (tests, or a caller with its own
  // credentials); `target` is used only in error messages.
  JobClient(std::shared_ptr<grpc::ChannelInterface> channel,
            std::string target, absl::Duration rpc_timeout = absl::Seconds(5));

  JobClient(const JobClient&) = delete;
  JobClient& operator=(const JobClient&) = delete;

  // A snapshot of the whole job: members, shards, progress, evaluation.
  absl::StatusOr<v1::JobStatus> GetStatus() const;

  // Streams a snapshot every `interval` and calls on_status with each, until
  // a snapshot shows the job ended (that snapshot is delivered), on_status
  // returns false, or the coordinator closes the stream. Returns OK in those
  // cases, and the stream's error otherwise (e.g. UNAVAILABLE when the
  // coordinator goes away before the job ended). No overall deadline.
  absl::Status Watch(
      absl::Duration interval,
      const std::function<bool(const v1::JobStatus&)>& on_status) const;

  // Where every chunk of the model lives, and each shard's address.
  absl::StatusOr<v1::ShardMap> GetShardMap() const;

  // Asks the coordinator to stop the job; `reason` ends up in
  // JobStatus.message. Returns once the coordinator accepted the request.
  absl::Status Stop(const std::string& reason) const;

  // Asks worker `rank` to leave the job after its step in progress.
  absl::Status Drain(uint32_t rank) const;

  // Asks the job to re-shard to `num_servers` shards (jobs with
  // max_servers); returns the move's progress as the coordinator took it.
  absl::StatusOr<v1::ReshardProgress> ScaleServers(uint32_t num_servers) const;

  // Where a move to `servers` shards, asked for when the job had completed
  // `completed` re-shardings, stands in `status` (grpsctl scale --wait):
  // done, asked back to where the job was, moving to `other` shards that
  // another scale asked for meanwhile (or moved there), or still under way.
  struct ScaleWait {
    enum Outcome { kUnderWay, kDone, kAskedBack, kSuperseded } outcome = kUnderWay;
    uint32_t other = 0;  // kSuperseded: the count the move goes (or went) to
  };
  static ScaleWait JudgeScaleWait(const v1::JobStatus& status, uint32_t servers,
                                  uint64_t completed);

  // Asks for a checkpoint now (or joins the one in progress). With `wait`,
  // returns once it is complete or failed, waiting up to `wait_timeout`
  // (DEADLINE_EXCEEDED after); otherwise once it is asked for.
  // FAILED_PRECONDITION when the job has no checkpoint_dir or is not
  // running.
  absl::StatusOr<v1::CheckpointSummary> Checkpoint(
      bool wait, absl::Duration wait_timeout = absl::Minutes(5)) const;

  const std::string& target() const { return target_; }

 private:
  // A context whose deadline is rpc_timeout_ from now.
  std::unique_ptr<grpc::ClientContext> UnaryContext() const;
  // `status` as an absl::Status whose message names the call and the target.
  absl::Status Error(const char* call, const grpc::Status& status) const;

  const std::string target_;
  const absl::Duration rpc_timeout_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
};

}  // namespace grps

#endif  // GRPS_CLIENT_JOB_CLIENT_H_
