// ShardStore: the dense parameters one shard holds, with their optimizer
// state, and the consistency rules (sync / async) under which gradients
// become updates.
//
// Each chunk has its own mutex and condition variable; no lock spans the
// shard on the hot path, so pushes and pulls of different chunks run in
// parallel. A push that names several chunks locks them in ascending chunk id
// order (the only place two chunk locks are held at once), which makes the
// push all-or-nothing without a global lock.
//
// Inputs are trusted: the caller (ParameterServerService, the network edge)
// has checked job id, rank, chunk ownership, lengths and finiteness. What the
// store still decides is whether a well-formed gradient fits the current
// state (step, staleness, incarnation); those refusals are
// FAILED_PRECONDITION and change nothing but the rejection counter.
//
// Accounting unit: one chunk gradient. `pushes` counts chunk gradients
// accepted (added, applied or acknowledged as duplicates), `duplicate_pushes`
// those recognised as retries, `rejected_pushes` those refused, `pulls` the
// chunks served.
//
// Thread safety: every public method may be called from any thread.
#ifndef GRPS_SERVER_SHARD_STORE_H_
#define GRPS_SERVER_SHARD_STORE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "proto/grps.pb.h"
#include "tensor/backend.h"
#include "tensor/dtype.h"

namespace grps {

class ShardStore {
 public:
  // Staleness histogram size; the last bucket counts staleness >= its index.
  static constexpr int kStalenessBuckets = 16;

  struct Options {
    v1::JobConfig config;
    v1::ShardMap shard_map;
    uint32_t shard = 0;
    // Reported in Status(); the coordinator gives both at registration.
    uint64_t incarnation = 0;
    std::string address;
    // Makes the backend that runs one chunk's optimizer updates. Called once
    // per chunk: a Backend serves one thread at a time, and chunks update in
    // parallel. Default: CreateCpuBackend.
    std::function<std::unique_ptr<Backend>()> make_backend;
  };

  // One chunk's gradient, as f32 values the caller keeps alive for the call.
  struct ChunkGradient {
    uint32_t chunk_id = 0;
    // Async: the chunk version the gradient was computed on.
    uint64_t base_version = 0;
    absl::Span<const float> values;  // exactly the chunk's num_elements
    uint64_t wire_bytes = 0;         // payload size on the wire, for bytes_in
  };

  struct GradientPush {
    uint32_t worker_rank = 0;
    uint64_t incarnation = 0;
    uint64_t step = 0;
    std::vector<ChunkGradient> chunks;  // distinct ids owned by this shard
  };

  struct PushResult {
    // Per pushed chunk, in request order. Sync: the version at which the
    // step completes (step + 1). Async: the chunk's version after the push.
    std::vector<uint64_t> versions;
    uint32_t duplicates = 0;
  };

  struct PulledChunk {
    uint32_t chunk_id = 0;
    uint64_t version = 0;
    std::string data;  // num_elements values in the requested dtype
  };

  // Builds the shard's chunks from a config and map received from the
  // coordinator and initializes their values deterministically
  // (InitializeRange). Validates config and map (InvalidArgument) because the
  // store's memory safety depends on them.
  static absl::StatusOr<std::unique_ptr<ShardStore>> Create(Options options);

  ~ShardStore();
  ShardStore(const ShardStore&) = delete;
  ShardStore& operator=(const ShardStore&) = delete;

  // Immutable after Create; safe to read without locking.
  const v1::JobConfig& config() const { return config_; }
  const v1::ShardMap& shard_map() const { return map_; }
  uint32_t shard() const { return shard_; }
  // Ids of this shard's chunks, ascending.
  const std::vector<uint32_t>& chunk_ids() const { return chunk_ids_; }

  // Applies or aggregates a gradient push under the job's mode (see
  // shard_store.cc for the rules). All-or-nothing: either every chunk is
  // accepted or none changes. FAILED_PRECONDITION for a stale incarnation, a
  // step that is not current (sync), or a gradient too stale (async);
  // UNAVAILABLE after Shutdown.
  absl::StatusOr<PushResult> Push(const GradientPush& push);

  // Reads the given chunks (empty: all of this shard's), waiting for each to
  // reach `min_version` until `deadline` (DEADLINE_EXCEEDED naming the chunk,
  // the wanted and the current version). Values are converted to `dtype`
  // while the chunk is locked; a waiting pull holds no lock. A pull that
  // fails serves and counts nothing.
  absl::StatusOr<std::vector<PulledChunk>> Pull(
      absl::Span<const uint32_t> chunk_ids, uint64_t min_version,
      absl::Time deadline, DType dtype);

  // A chunk's values and version as they are now, without waiting and
  // without counting a pull (for checkpoints and tests). NOT_FOUND for a
  // chunk this shard does not hold.
  struct ChunkValues {
    uint64_t version = 0;
    std::vector<float> values;
  };
  absl::StatusOr<ChunkValues> ReadChunk(uint32_t chunk_id) const;

  // Replaces the quorum of a sync step with `ranks` (ranks >= num_workers
  // are ignored) and records their incarnations (0 = unknown; a known
  // incarnation never goes back). Completes every pending step whose
  // contributors now cover the live set. Called by the heartbeat loop.
  void SetLiveWorkers(absl::Span<const uint32_t> ranks,
                      absl::Span<const uint64_t> incarnations);

  // Counts a push refused at the network edge (bad input) as rejected.
  void CountRejectedAtEdge(uint64_t chunk_gradients);

  // A consistent-per-chunk snapshot of the shard's counters and versions.
  v1::ShardStatus Status() const;

  // Wakes every waiting pull with UNAVAILABLE; later pushes and pulls fail
  // with UNAVAILABLE. Idempotent.
  void Shutdown();

 private:
  struct Chunk;
  class ChunkLocks;

  explicit ShardStore(Options options);
  absl::Status Initialize();

  // Checks and records the pusher's incarnation. FAILED_PRECONDITION when it
  // is older than the one known for the rank.
  absl::Status AdmitIncarnation(uint32_t rank, uint64_t incarnation)
      ABSL_LOCKS_EXCLUDED(members_mu_);
  absl::StatusOr<PushResult> PushSync(const GradientPush& push,
                                      const std::vector<Chunk*>& chunks);
  absl::StatusOr<PushResult> PushAsync(const GradientPush& push,
                                       const std::vector<Chunk*>& chunks);
  // Applies the pending sync step of `chunk` if its contributors cover the
  // live workers.
  void MaybeCompleteSyncStep(Chunk& chunk);
  // One optimizer update of `chunk` from `grad` with learning rate `lr`;
  // bumps the version and wakes pulls.
  void ApplyUpdate(Chunk& chunk, const float* grad, float lr);
  Chunk* FindChunk(uint32_t chunk_id) const;

  const v1::JobConfig config_;
  const v1::ShardMap map_;
  const uint32_t shard_;
  const uint64_t incarnation_;
  const std::string address_;
  const std::function<std::unique_ptr<Backend>()> make_backend_;
  const uint32_t num_workers_;
  const bool sync_;

  // Built by Initialize, then immutable (the Chunks themselves are not).
  std::vector<uint32_t> chunk_ids_;
  std::vector<std::unique_ptr<Chunk>> chunks_;  // ascending chunk id
  std::vector<int> local_index_;                // global chunk id -> chunks_

  // Membership. Lock order: a chunk's mutex before members_mu_.
  mutable absl::Mutex members_mu_;
  std::vector<bool> live_ ABSL_GUARDED_BY(members_mu_);          // by rank
  std::vector<uint64_t> incarnation_of_ ABSL_GUARDED_BY(members_mu_);

  std::atomic<bool> shutdown_{false};
  // Every refusal, at the edge or here; rare, so one shared counter.
  std::atomic<uint64_t> rejected_{0};
};

}  // namespace grps

#endif  // GRPS_SERVER_SHARD_STORE_H_
