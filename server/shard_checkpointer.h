// ShardCheckpointer: takes the checkpoints the coordinator asks a shard
// for, one at a time, on a thread of its own: capture (which may wait for a
// sync step boundary), then write the shard's file. The heartbeat thread
// only arms a request and hands it over, never waiting for a write: an
// fsync that takes seconds on a busy disk must not stop the heartbeats, or
// the coordinator would take the shard for dead. The outcome is reported
// through the store's ShardStatus, the newest request's only.
//
// Incremental checkpoints (JobConfig.checkpoint_full_every = K > 0): a
// checkpoint right after one this shard wrote, in the same generation,
// captures only what changed since (CheckpointCapture::Arm), on top of the
// chain of files that one needed, up to K in a row; any failure, restore or
// skipped checkpoint starts again with a full file.
//
// Thread safety: MaybeStart is called from one thread (the heartbeat's);
// Join from any.
#ifndef GRPS_SERVER_SHARD_CHECKPOINTER_H_
#define GRPS_SERVER_SHARD_CHECKPOINTER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/grps.pb.h"
#include "server/shard_store.h"

namespace grps {

class ShardCheckpointer {
 public:
  // How long a checkpoint may wait for its version to be reached.
  static constexpr absl::Duration kCaptureTimeout = absl::Seconds(60);

  // Writes into OwnCheckpointFolder(..., `own_dir`). `before`: the
  // checkpointer of the store `store` replaces (a re-sharding), whose last
  // request is not started again on this one (it would write the new
  // layout into that checkpoint's folder).
  ShardCheckpointer(ShardStore* store, std::string own_dir,
                    const ShardCheckpointer* before = nullptr);
  ~ShardCheckpointer() { Join(); }

  // Starts checkpoint `request` unless it is the one last started. One still
  // being taken (waiting for its version) is superseded: the coordinator
  // has given up on it. One still being written finishes first.
  void MaybeStart(const v1::CheckpointRequest& request);

  // Takes the request handed over last, if any, and ends the thread.
  void Join();

 private:
  struct Pending {
    v1::CheckpointRequest request;
    uint64_t seq = 0;
    // An incremental checkpoint: the files it applies on top of (the full
    // one first); empty for a full one. The store's generation at the arm.
    std::vector<v1::ShardFileRef> base;
    uint64_t generation = 0;
  };

  void Loop();
  void Take(const Pending& pending);
  // What checkpoint `request` may apply on top of, asked right after
  // `previous` (the request started before it): the chain of the newest
  // file this shard wrote, when that is `previous`'s, of this generation,
  // and the chain is shorter than the job allows; else none (a full file).
  std::vector<v1::ShardFileRef> IncrementalBase(const v1::CheckpointRequest& request,
                                                uint64_t previous) ABSL_LOCKS_EXCLUDED(mu_);
  // Loop's wait condition (called by Await, with mu_ held).
  bool HasWorkLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return pending_.has_value() || stopping_;
  }

  ShardStore* const store_;
  const std::string own_dir_;
  // The request last started, by (id, coordinator incarnation): used by
  // the heartbeat thread only.
  uint64_t last_id_ = 0;
  uint64_t last_incarnation_ = 0;
  absl::Mutex mu_;
  uint64_t latest_ ABSL_GUARDED_BY(mu_) = 0;  // the newest request's number
  std::optional<Pending> pending_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // The newest file written and the files it applies on top of (the full
  // one first; empty after a failure), and the generation it was cut in.
  std::vector<v1::ShardFileRef> chain_ ABSL_GUARDED_BY(mu_);
  uint64_t chain_generation_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;  // last: started once the members above exist
};

}  // namespace grps

#endif  // GRPS_SERVER_SHARD_CHECKPOINTER_H_
