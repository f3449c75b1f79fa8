// ParameterShards: what a trainer needs of the job's dense parameters on
// the shards, and nothing more: pull the weights of a clock, push a step's
// gradient (fused with the pull of the next clock), follow a new shard map
// and a new generation. ParameterClient implements it over gRPC; a trainer's
// tests give it an in-memory one.
//
// The flat parameter array, clocks, versions and generations mean what they
// mean in ParameterClient (worker/parameter_client.h).
//
// Thread safety: as ParameterClient's: UpdateShardMap, map_epoch,
// set_generation and traffic may be called from any thread while a pull or
// push runs on another; pulls and pushes are the training thread's, one at
// a time.
#ifndef GRPS_WORKER_PARAMETER_SHARDS_H_
#define GRPS_WORKER_PARAMETER_SHARDS_H_

#include <cstdint>
#include <functional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/grps.pb.h"

namespace grps {

class ParameterShards {
 public:
  // What the shards made of a push besides applying it: chunk gradients that
  // arrived after their sync step (late: folded or dropped by the shard) and
  // chunk gradients refused as too stale. Both are counted by the shards.
  struct PushOutcome {
    uint32_t late = 0;
    uint32_t too_stale = 0;
    // A push with `pull_into`: every chunk's values for clock step + 1
    // arrived with the replies (and their versions are recorded, as a Pull
    // records them). False: pull as usual.
    bool pulled = false;
  };

  // How long a push keeps retrying a shard that is UNAVAILABLE (down, or
  // not restored to this generation yet) or RESOURCE_EXHAUSTED (short of
  // memory for calls right now), with backoff.
  struct RetryPolicy {
    absl::Duration retry_for = absl::Seconds(60);
    absl::Duration initial_backoff = absl::Milliseconds(50);
    absl::Duration max_backoff = absl::Seconds(2);
    // Polled (from the per-shard threads, so it must be thread-safe) after
    // every failed attempt and while backing off; once it returns true the
    // push gives up with CANCELLED. Null: never.
    std::function<bool()> stop;
  };

  // What went over the wire so far, for the worker's metrics and log.
  struct Traffic {
    uint64_t bytes_pushed = 0;
    uint64_t bytes_pulled = 0;
    uint64_t lane_bytes = 0;  // of those, through shared-memory lanes
    uint64_t push_calls = 0;
    uint64_t doorbell_calls = 0;  // of those, rung at lane doorbells
  };

  virtual ~ParameterShards() = default;

  // The length of the flat parameter (and gradient) array.
  virtual int64_t num_parameters() const = 0;

  // The job generation every later push and pull carries (0 = unchecked);
  // a shard refuses a push or pull of an older one with ABORTED.
  virtual void set_generation(uint64_t generation) = 0;

  // Follows a newer shard map (a shard that moved); INVALID_ARGUMENT,
  // nothing changed, for a map that does not fit the layout. map_epoch: the
  // epoch of the map in use.
  virtual absl::Status UpdateShardMap(const v1::ShardMap& map) = 0;
  virtual uint64_t map_epoch() const = 0;

  // Fills host_params (num_parameters() floats) with the weights for
  // `clock`, the step the worker is about to compute; the shards hold the
  // pull as the mode requires, at most `timeout` (DEADLINE_EXCEEDED). One
  // attempt: the caller decides whether to try again. A pull that follows
  // one of the same clock, generation and `host_params` that read only
  // some of the weights (a pull or fused pull that failed or timed out in
  // part) reads only the rest: what it read stays as read (one clock's
  // weights; in ssp(0) the shard would answer the same, in ssp(s) what it
  // answers again may hold later updates within the bound), and no bytes
  // come twice.
  virtual absl::Status Pull(uint64_t clock, absl::Duration timeout, float* host_params) = 0;

  // Pushes the gradient of `step` (num_parameters() floats from host_grads,
  // computed on `num_samples` examples), retrying per `retry`; with
  // `pull_into`, fused with the pull of clock step + 1 (at most
  // `pull_timeout`; PushOutcome::pulled says whether it came). A retried
  // push is applied once. ABORTED (the job rolled back) as it is.
  virtual absl::StatusOr<PushOutcome> PushAndPull(uint64_t step, const float* host_grads,
                                                  uint32_t num_samples, float* pull_into,
                                                  absl::Duration pull_timeout,
                                                  const RetryPolicy& retry) = 0;

  // The largest chunk version the last pull (or fused pull) saw.
  virtual uint64_t max_pulled_version() const = 0;

  virtual Traffic traffic() const = 0;
};

}  // namespace grps

#endif  // GRPS_WORKER_PARAMETER_SHARDS_H_
