// ShardStore: the parameters one shard holds (dense chunks, and the rows of
// sparse tables hashed to it), with their optimizer state, under the job's
// consistency mode. It is the facade ParameterServerService uses; each
// concern is a part of its own:
//
//   store_targets.h     the chunks and tables, their locks and lock order
//   push_admission.h    incarnations, deduplication, what a gradient became
//   waiting_pulls.h     the pulls that wait, and the timer thread
//   shard_checkpoint.h  checkpoint capture and restore
//   shard_status.h      counters and the ShardStatus report
//
// and the rules of each mode live in its ChunkPolicy
// (server/consistency_policy.h, one per chunk and table).
//
// Each chunk has its own mutex; no lock spans the shard on the hot path, so
// pushes and pulls of different chunks run in parallel. A push that names
// several chunks locks them in ascending chunk id order (TargetLocks, the
// only place two chunk locks are held at once), which makes the push
// all-or-nothing without a global lock. Lock order: the checkpoint
// capture's mutex, the targets' (TargetLocks order), the live set's; the
// waiting pulls' mutex is never held with a target's.
//
// A push is admitted in two places: at the network edge
// (request_checks.h: job, rank, each chunk or row, sizes, every value in
// range), then here, in one pass (Admit, below), which checks what only
// the store knows: the rank's live incarnation, the values given, the
// generation, duplicates and the mode's rules. Those refusals change
// nothing (the rejection counter aside). Late and too-stale gradients are
// not refusals: they are outcomes of the mode, counted and reported in the
// PushResult.
//
// Generations. Restore replaces every target's state (from a checkpoint, or
// the initial values: no rows) and moves the shard to a new job generation;
// a push or pull tagged with an older generation is then refused with
// ABORTED, one with a newer generation with UNAVAILABLE (0 = unchecked), and
// pulls waiting from before fail ABORTED.
//
// Thread safety: every public method may be called from any thread.
#ifndef GRPS_SERVER_SHARD_STORE_H_
#define GRPS_SERVER_SHARD_STORE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "proto/grps.pb.h"
#include "server/consistency_policy.h"
#include "server/push_admission.h"
#include "server/shard_checkpoint.h"
#include "server/shard_status.h"
#include "server/sparse_rows.h"
#include "server/store_targets.h"
#include "server/waiting_pulls.h"
#include "tensor/backend.h"
#include "tensor/dtype.h"

namespace grps {

class ShardStore {
 public:
  // Staleness histogram size (shard_status.h).
  static constexpr int kStalenessBuckets = ::grps::kStalenessBuckets;

  struct Options {
    v1::JobConfig config;
    v1::ShardMap shard_map;
    uint32_t shard = 0;
    // Reported in ShardStatus(); the coordinator gives both at registration.
    uint64_t incarnation = 0;
    std::string address;
    // Makes the backend that runs one chunk's optimizer updates. Called once
    // per chunk: a Backend serves one thread at a time, and chunks update in
    // parallel. Default: CreateCpuBackend.
    std::function<std::unique_ptr<Backend>()> make_backend;
    // The job generation the shard starts in, and the state its chunks start
    // from: one ChunkState per chunk of this shard, from checkpoint
    // `restored_checkpoint` (empty: the initial values), and one TableState
    // per sparse table (its rows on this shard), as Restore takes them.
    uint64_t generation = 0;
    uint64_t restored_checkpoint = 0;
    std::vector<v1::ChunkState> restore;
    std::vector<v1::TableState> restore_tables;
    // By rank: the step each worker resumes at (RestoreOrder.worker_steps).
    std::vector<uint64_t> resume_steps;
    // Pulls that may wait at once; more get RESOURCE_EXHAUSTED. 0:
    // MaxWaitingPulls of the config and map.
    size_t max_waiting_pulls = 0;
  };

  // A worker's pull of a shard is a request per part of the shard's chunks
  // (worker/chunk_layout.h: about 256 KiB each, a chunk of the default
  // size), and a sparse pull a request per table (more for one of over 16
  // MiB): a shard of 256 MiB takes 1,024 requests, all of them waiting
  // when they ask for a step not yet complete. So each worker may have
  // twice the shard's chunks and four times its tables waiting (a pull of
  // the next step may come before the last one's answer is taken), and at
  // least kWaitingPullsPerWorker; the workers together, that many each.
  static constexpr size_t kWaitingPullsPerWorker = 256;
  static size_t MaxWaitingPulls(const v1::JobConfig& config, const v1::ShardMap& map,
                                uint32_t shard, uint32_t workers);

  // One chunk's gradient, as f32 values the caller keeps alive for the call.
  struct ChunkGradient {
    uint32_t chunk_id = 0;
    // The chunk version the gradient was computed on.
    uint64_t base_version = 0;
    absl::Span<const float> values;  // exactly the chunk's num_elements
    uint64_t wire_bytes = 0;         // payload size on the wire, for bytes_in
    // The program's optimizer for its update (checked by
    // CheckProgramOptimizer; the caller keeps it alive); null: the job's.
    const v1::OptimizerConfig* optimizer = nullptr;
  };

  struct GradientPush {
    uint32_t worker_rank = 0;
    uint64_t incarnation = 0;
    uint64_t step = 0;  // the worker's clock
    uint64_t generation = 0;  // 0: unchecked
    std::vector<ChunkGradient> chunks;  // distinct ids owned by this shard
  };

  struct PushResult {
    // Per pushed chunk, in request order: the chunk's version after the push
    // (sync: the version at which the gradient's step completes).
    std::vector<uint64_t> versions;
    uint32_t duplicates = 0;
    uint32_t late = 0;       // sync: arrived after their step (folded or dropped)
    uint32_t too_stale = 0;  // async / ssp: refused by max_staleness
  };

  struct PulledChunk {
    uint32_t chunk_id = 0;
    uint64_t version = 0;
    // num_elements values in the requested dtype, in a buffer from
    // BufferPool::Default() (give it back there when done, or let it go);
    // empty when PullSpec::into named where they go.
    std::string data;
  };

  // When a pull may be answered; shared by dense and sparse pulls.
  struct PullWait {
    uint32_t worker_rank = 0;
    uint64_t min_version = 0;
    // The worker's clock: the mode decides how long the pull waits. Unset:
    // wait only for min_version.
    std::optional<uint64_t> clock;
    absl::Time deadline = absl::InfiniteFuture();
    DType dtype = DType::kF32;
    uint64_t generation = 0;  // 0: unchecked
    // Set (by the edge, when the call is cancelled) to end the wait with
    // CANCELLED at the next WakePulls; null: never.
    std::shared_ptr<const std::atomic<bool>> cancelled;
  };

  struct PullSpec : PullWait {
    std::vector<uint32_t> chunk_ids;  // empty: every chunk of this shard
    // Empty, or one destination per chunk id (which must then be given):
    // each chunk's values are written there, in `dtype`, instead of into
    // PulledChunk::data (left empty). The caller keeps them writable until
    // the callback has run.
    std::vector<char*> into;
  };
  using PullCallback =
      std::function<void(absl::StatusOr<std::vector<PulledChunk>>)>;

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
  // push_admission.h and the policies for the rules). All-or-nothing: either every chunk is
  // accepted or none changes. FAILED_PRECONDITION for a stale incarnation, a
  // step that is not current (sync), or a gradient too stale (async);
  // UNAVAILABLE after Shutdown.
  absl::StatusOr<PushResult> Push(const GradientPush& push);
  // A user model's initial values (PushRequest.initial_values), from worker
  // rank 0 (PERMISSION_DENIED otherwise): each chunk that awaits its values
  // takes them (StoreChunk::Give), the others keep theirs; waiting pulls
  // are looked at again. The number of chunks that took them.
  // INVALID_ARGUMENT, nothing changed, for a value that is not finite.
  absl::StatusOr<uint32_t> GiveInitialValues(const GradientPush& push);

  // ---- A program's optimizer state (grps.torch's optimizer.state_dict()) ----

  // The optimizer state of `chunk_ids` (distinct, each of this shard's) as
  // it is now, in that order: the slots (ChunkOptimizerState's) and the
  // updates the optimizer has counted. Each chunk is read under its lock:
  // in sync, between a worker's step and its next push, that is the state
  // after the step. ABORTED / UNAVAILABLE for another generation (as Pull).
  absl::StatusOr<v1::GetOptimizerStateResponse> ReadOptimizerState(
      uint64_t generation, absl::Span<const uint32_t> chunk_ids) const;
  // Replaces the optimizer state of the request's chunks, checked by the
  // edge (each of this shard's, distinct, with the job's slots of their
  // lengths, finite): each chunk's update count then goes on from the
  // state's steps. All or nothing: FAILED_PRECONDITION, nothing changed,
  // when one of them has had an update (the state of a program's saved
  // optimizer starts a job; it does not replace a running job's), or for a
  // stale incarnation; ABORTED / UNAVAILABLE for another generation.
  absl::Status LoadOptimizerState(const v1::LoadOptimizerStateRequest& request);

  // Reads the chunks of `spec` once each is ready (version >= min_version
  // and, with a clock, the mode allows it) and calls `done` with them, or
  // with DEADLINE_EXCEEDED (naming the chunk, the wanted and the current
  // version) at the deadline, NOT_FOUND for a chunk this shard does not
  // hold, UNAVAILABLE after Shutdown. `done` runs exactly once, possibly in
  // this call, otherwise on the thread that made the pull ready; it must not
  // call back into the store's PullAsync on that thread. Values are converted
  // to `dtype` under the chunk's lock. A pull that fails serves and counts
  // nothing.
  // RESOURCE_EXHAUSTED when max_waiting_pulls pulls wait already.
  void PullAsync(PullSpec spec, PullCallback done);
  // Looks at every waiting pull again now (after a PullSpec.cancelled was
  // set).
  void WakePulls() { pulls_.Wake(); }
  // Pulls waiting now (a test can wait for a pull to be blocked).
  size_t waiting_pulls() const { return pulls_.size(); }

  // ---- Sparse tables (JobConfig.sparse_tables; docs/sparse.md) ----
  //
  // Each table's rows on this shard are one target of the consistency
  // engine, as a dense chunk is: one version, one policy, dedup marks per
  // rank. A sparse push is one worker's gradient of one table for one step;
  // sync aggregates the step's pushes (rows summed per id) and applies their
  // average once every live worker has pushed, async applies each on
  // arrival, ssp holds it as it would a chunk's.

  // One worker's gradient of one table, checked by the edge: ids distinct,
  // in the table's range and hashed to this shard, values finite.
  struct SparseGradientPush {
    uint32_t worker_rank = 0;
    uint64_t incarnation = 0;
    uint64_t step = 0;
    uint64_t generation = 0;  // 0: unchecked
    std::string table;
    uint64_t base_version = 0;  // the table version it was computed on
    absl::Span<const int64_t> ids;
    absl::Span<const float> values;  // ids.size() x dim
    uint64_t wire_bytes = 0;
  };
  struct SparsePushResult {
    uint64_t version = 0;  // as PushResult.versions
    bool duplicate = false;
    bool late = false;
    bool too_stale = false;
  };
  // As Push, for one table. Also FAILED_PRECONDITION (nothing changes) when
  // the push would create rows past the table's max_rows_per_shard
  // (SparseRows::CheckRoom), and NOT_FOUND for a table the job does not have.
  absl::StatusOr<SparsePushResult> PushSparse(const SparseGradientPush& push);

  struct SparsePullSpec : PullWait {
    std::string table;
    std::vector<int64_t> ids;  // checked by the edge; may repeat
    std::string reply;         // becomes PulledRows.data: its room is reused
  };
  struct PulledRows {
    uint64_t version = 0;
    std::string data;  // ids.size() x dim values in the requested dtype
  };
  using SparsePullCallback = std::function<void(absl::StatusOr<PulledRows>)>;
  // As PullAsync, for rows of one table (created on first use; as CheckRoom
  // says, FAILED_PRECONDITION past max_rows_per_shard).
  void PullSparseAsync(SparsePullSpec spec, SparsePullCallback done);
  absl::StatusOr<PulledRows> PullSparse(SparsePullSpec spec);

  // A row's values now, or NOT_FOUND when the table or row does not exist
  // on this shard (tests).
  absl::StatusOr<std::vector<float>> TEST_ReadRow(const std::string& table,
                                                  int64_t id) const;

  // PullAsync, waiting for the answer (tests and simple callers).
  absl::StatusOr<std::vector<PulledChunk>> Pull(
      absl::Span<const uint32_t> chunk_ids, uint64_t min_version,
      absl::Time deadline, DType dtype);
  absl::StatusOr<std::vector<PulledChunk>> Pull(PullSpec spec);

  // A chunk's values and version as they are now, without waiting and
  // without counting a pull (for checkpoints and tests). NOT_FOUND for a
  // chunk this shard does not hold.
  struct ChunkValues {
    uint64_t version = 0;
    std::vector<float> values;
  };
  absl::StatusOr<ChunkValues> TEST_ReadChunk(uint32_t chunk_id) const;

  // Replaces the live workers with `ranks` (ranks >= num_workers are
  // ignored) and records their incarnations (0 = unknown; a known
  // incarnation never goes back) and, for sync, the step each counts toward
  // the quorum from (`counts_from`, parallel; missing: 0). The mode reacts
  // (a sync step may complete, held ssp gradients may apply) and waiting
  // pulls are re-examined. Called by the heartbeat loop.
  void SetLiveWorkers(absl::Span<const uint32_t> ranks,
                      absl::Span<const uint64_t> incarnations,
                      absl::Span<const uint64_t> counts_from = {});

  // ---- Durability ----

  uint64_t generation() const { return generation_.load(); }
  // OK for generation 0 or the shard's; ABORTED for an older one,
  // UNAVAILABLE for a newer one.
  absl::Status CheckGeneration(uint64_t generation) const;

  // The shard's part of checkpoint `request`: every chunk (ascending id) and
  // every sparse table's rows (config order) as the mode cuts them
  // (shard_checkpoint.h): in sync at exactly request.version() (0: now),
  // waiting, on the calling thread, for those still below it; otherwise as
  // they are now.
  // FAILED_PRECONDITION naming the chunk or table when one is already past
  // the version; DEADLINE_EXCEEDED when a chunk has not reached it by
  // `deadline`; ABORTED if the shard is restored meanwhile.
  absl::StatusOr<v1::ShardCheckpointFile> CaptureCheckpoint(
      const v1::CheckpointRequest& request, absl::Time deadline);
  // CaptureCheckpoint in two halves: ArmCheckpoint copies the targets (chunks
  // and tables) that are at the version (all of them for version 0) and arms
  // the others, without waiting (FAILED_PRECONDITION as above); it supersedes
  // an earlier capture, whose CollectCheckpoint then returns ABORTED.
  // CollectCheckpoint waits for the armed targets and returns the file.
  // `changes_only`: an incremental capture (CheckpointCapture::Arm).
  absl::Status ArmCheckpoint(const v1::CheckpointRequest& request, bool changes_only = false);
  // `id` names the armed checkpoint to collect (ABORTED if another one has
  // been armed since).
  absl::StatusOr<v1::ShardCheckpointFile> CollectCheckpoint(uint64_t id, absl::Time deadline);

  // Moves the shard to `generation` with its chunks as in `states` (one per
  // chunk of this shard, any order; empty: the initial values at version 0)
  // and its sparse tables as in `tables` (one per table, its rows that hash
  // to this shard; needed when checkpoint_id > 0, else empty: no rows at
  // version 0), the optimizer state and dedup marks included, and the mode's
  // pending state (an open sync step, held ssp gradients) dropped.
  // All-or-nothing: INVALID_ARGUMENT (nothing changes) when a state is
  // missing or does not fit its chunk or table (a row of another shard or
  // out of range included), FAILED_PRECONDITION when a table's rows pass
  // its max_rows_per_shard or `generation` is not newer.
  // `resume_steps` (by rank) are the steps the workers resume at; ssp starts
  // its clocks there on every shard alike. A rank without one rejoins at its
  // first pull.
  absl::Status Restore(uint64_t generation, uint64_t checkpoint_id,
                       const std::vector<v1::ChunkState>& states,
                       absl::Span<const uint64_t> resume_steps,
                       const std::vector<v1::TableState>& tables = {});

  // The shard's report of its part of the newest checkpoint, shown in
  // ShardStatus().checkpoint().
  void SetCheckpointReport(const v1::ShardCheckpoint& report)
      ABSL_LOCKS_EXCLUDED(report_mu_);

  // Counts a push refused at the network edge (bad input) as rejected.
  void CountRejectedAtEdge(uint64_t chunk_gradients);

  // A consistent-per-chunk snapshot of the shard's counters and versions.
  v1::ShardStatus ShardStatus() const;

  // Wakes every waiting pull with UNAVAILABLE; later pushes and pulls fail
  // with UNAVAILABLE. Idempotent.
  void Shutdown();

 private:
  struct Waiter;
  struct DenseWaiter;
  struct SparseWaiter;

  explicit ShardStore(Options options);
  absl::Status Initialize();

  StoreChunk* FindChunk(uint32_t chunk_id) const;
  StoreTable* FindTable(std::string_view name) const;
  // Every target, chunks then tables (for the loops over all of them).
  std::vector<StoreTarget*> AllTargets() const;
  // UNAVAILABLE after Shutdown, INVALID_ARGUMENT for an unknown rank (the
  // edge's CheckRank, kept for callers in the process: a rank past the
  // job's would index past the store's arrays).
  absl::Status CheckWorker(uint32_t rank) const;

  // ---- A push's admission: the store's one pass ----
  //
  // Every push (gradients of chunks or of a table's rows, a user model's
  // initial values, a program's optimizer state) is admitted by Admit, once,
  // before anything changes; the first refusal ends it, nothing changed:
  //
  //   1. the shard runs                      UNAVAILABLE after Shutdown
  //   2. the rank is the job's (*)           INVALID_ARGUMENT
  //   3. the targets (*): each chunk this shard's, with one value per
  //      element; the table the job's, with dim values per row
  //                                          NOT_FOUND, INVALID_ARGUMENT
  //   4. no target twice (*)                 INVALID_ARGUMENT
  //      -- the targets' locks are taken (TargetLocks): a Restore or
  //         another push of these targets is wholly before or after --
  //   5. the pusher's incarnation is not older than the rank's live one
  //                                          FAILED_PRECONDITION, counted
  //   6. gradients of chunks: none awaits rank 0's initial values
  //                                          UNAVAILABLE
  //   7. the generation is the shard's (or 0, unchecked)
  //                                          ABORTED older, UNAVAILABLE newer
  //   8. what the kind decides (DecideLocked):
  //      gradients: PushAdmission::Decide (each target's marks: an older
  //        incarnation's refused, a step the target has already taken a
  //        duplicate; the mode's policy: a base version the target never
  //        had, in sync one not newer than the rank's last)
  //                                          FAILED_PRECONDITION, counted
  //        then a sparse push's new rows within max_rows_per_shard
  //                                          FAILED_PRECONDITION, counted
  //      initial values: every value finite (*)   INVALID_ARGUMENT
  //      optimizer state: no chunk updated yet    FAILED_PRECONDITION
  //
  // (*) The edge has checked these already (CheckRank, CheckChunk,
  // CheckTable, the sizes, "twice", FirstOutOfRange), and every network path
  // reaches the store through it: ServePush (gRPC pushes, lane pushes,
  // doorbell rings; the Python binding's too, through the worker's client),
  // PushSparse and LoadOptimizerState. They are checked again here because
  // tests and fuzzers hand the store typed pushes directly, and a rank or
  // target out of range would index past the store's arrays, a short
  // gradient read past its end, a target twice deadlock TargetLocks.
  enum class Admitting { kChunkGradients, kRowGradients, kInitialValues, kOptimizerState };
  // A push past Admit: its targets with their gradients (request order),
  // which of them have its step already (gradients only), and the targets'
  // locks, held until this is destroyed.
  struct Admitted {
    std::vector<PushAdmission::TargetGradient> grads;
    std::vector<bool> duplicate;
    std::optional<TargetLocks> locks;
  };
  // The pass above, for `request` (a GradientPush, a SparseGradientPush or
  // a LoadOptimizerStateRequest) from `pusher`, tagged `generation`.
  template <typename Request>
  absl::Status Admit(const PushAdmission::Pusher& pusher, uint64_t generation,
                     const Request& request, Admitting what, Admitted* out);
  // Step 3: the targets a request names, each with its gradient.
  absl::StatusOr<std::vector<PushAdmission::TargetGradient>> TargetsOf(
      const GradientPush& push) const;
  absl::StatusOr<std::vector<PushAdmission::TargetGradient>> TargetsOf(
      const SparseGradientPush& push) const;
  absl::StatusOr<std::vector<PushAdmission::TargetGradient>> TargetsOf(
      const v1::LoadOptimizerStateRequest& request) const;
  // Steps 5 to 8, with the targets' locks held (a TargetLocks, which the
  // analysis cannot follow).
  absl::Status CheckLocked(const PushAdmission::Pusher& pusher, uint64_t generation,
                           Admitting what, Admitted* out) ABSL_NO_THREAD_SAFETY_ANALYSIS;
  // Step 8.
  absl::Status DecideLocked(const PushAdmission::Pusher& pusher, Admitting what,
                            Admitted* out) ABSL_NO_THREAD_SAFETY_ANALYSIS;

  // The updates after Admit, with its locks held: initial values given to
  // the chunks that await them (how many took them); an optimizer state
  // loaded.
  static uint32_t GiveLocked(const Admitted& admitted) ABSL_NO_THREAD_SAFETY_ANALYSIS;
  static void LoadOptimizerStateLocked(const Admitted& admitted,
                                       const v1::LoadOptimizerStateRequest& request)
      ABSL_NO_THREAD_SAFETY_ANALYSIS;
  // WaitingPulls' examiner: serves `pull` if every target is ready, or fails
  // it; true when it has its answer, false to wait.
  bool TryServe(WaitingPull& pull);
  // TryServe's first half: the first target not ready yet, and its version
  // (null: none).
  StoreTarget* Blocking(const Waiter& w, const LiveSet& live, uint64_t* version) const;

  const v1::JobConfig config_;
  const v1::ShardMap map_;
  const uint32_t shard_;
  const uint64_t incarnation_;
  const std::string address_;
  const std::function<std::unique_ptr<Backend>()> make_backend_;
  const uint32_t num_workers_;

  // Built by Initialize, then immutable (the targets themselves are not).
  std::vector<uint32_t> chunk_ids_;
  std::vector<std::unique_ptr<StoreChunk>> chunks_;  // ascending chunk id
  std::vector<int> local_index_;                     // global chunk id -> chunks_
  std::vector<std::unique_ptr<StoreTable>> tables_;  // as config.sparse_tables
  std::unique_ptr<CheckpointCapture> capture_;

  PushAdmission admission_;
  std::atomic<bool> shutdown_{false};
  // Changed only by Restore, with every target's lock held.
  std::atomic<uint64_t> generation_{0};
  std::atomic<uint64_t> restored_checkpoint_{0};
  mutable absl::Mutex report_mu_;
  v1::ShardCheckpoint report_ ABSL_GUARDED_BY(report_mu_);
  // Last: its timer thread examines the members above.
  WaitingPulls pulls_;
};

}  // namespace grps

#endif  // GRPS_SERVER_SHARD_STORE_H_
