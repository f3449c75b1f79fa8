#include "server/shard_store.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "job/initializer.h"
#include "job/job_config.h"
#include "job/shard_map.h"
#include "job/sparse_tables.h"
#include "server/chunk_optimizer.h"
#include "server/sparse_rows.h"
#include "wire/buffer_pool.h"

namespace grps {
namespace {

// The newest push of one rank accepted for one chunk (deduplication).
struct AcceptedMark {
  bool valid = false;
  uint64_t incarnation = 0;
  uint64_t step = 0;
};

struct ChunkCounters {
  uint64_t pushes = 0;
  uint64_t duplicates = 0;
  uint64_t updates = 0;
  uint64_t pulls = 0;
  uint64_t bytes_in = 0;
  uint64_t bytes_out = 0;
  uint64_t late_folded = 0;
  uint64_t late_dropped = 0;
  uint64_t too_stale = 0;
  uint64_t staleness_count = 0;
  uint64_t staleness_sum = 0;
  uint64_t staleness_max = 0;
  uint64_t staleness_histogram[ShardStore::kStalenessBuckets] = {};
  std::vector<uint64_t> late_by_worker;  // by rank

  void Add(const ChunkCounters& o) {
    pushes += o.pushes;
    duplicates += o.duplicates;
    updates += o.updates;
    pulls += o.pulls;
    bytes_in += o.bytes_in;
    bytes_out += o.bytes_out;
    late_folded += o.late_folded;
    late_dropped += o.late_dropped;
    too_stale += o.too_stale;
    staleness_count += o.staleness_count;
    staleness_sum += o.staleness_sum;
    staleness_max = std::max(staleness_max, o.staleness_max);
    for (int i = 0; i < ShardStore::kStalenessBuckets; ++i)
      staleness_histogram[i] += o.staleness_histogram[i];
    if (late_by_worker.size() < o.late_by_worker.size())
      late_by_worker.resize(o.late_by_worker.size(), 0);
    for (size_t r = 0; r < o.late_by_worker.size(); ++r)
      late_by_worker[r] += o.late_by_worker[r];
  }
};

}  // namespace

// What a dense chunk and a sparse table have in common as targets of the
// consistency engine: the version, the mode's policy, the dedup marks and
// the counters. Every member past the constants is guarded by `mu`; the
// policy is called with it held.
class ShardStore::Target : public UpdateTarget {
 public:
  // `order`: where the target's lock comes in the lock order (ChunkLocks).
  Target(uint64_t order, std::string name, const v1::JobConfig& config)
      : order(order), name(std::move(name)) {
    absl::MutexLock lock(&mu);
    policy = MakeChunkPolicy(config);
    marks.assign(config.num_workers(), AcceptedMark{});
    counters.late_by_worker.assign(config.num_workers(), 0);
  }

  uint64_t version() const override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return version_; }
  void Apply(const GradientRef& grad, float lr, int64_t staleness) final
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    Update(grad, lr);
    ++version_;
    ++counters.updates;
    // A sync checkpoint armed for this version takes the state now, before
    // any later update.
    if (capture_at != 0 && version_ == capture_at) {
      Capture(/*sync=*/true);
      capture_at = 0;
    }
    if (staleness < 0) return;
    const uint64_t st = static_cast<uint64_t>(staleness);
    ++counters.staleness_count;
    counters.staleness_sum += st;
    counters.staleness_max = std::max(counters.staleness_max, st);
    ++counters.staleness_histogram[std::min<uint64_t>(st, kStalenessBuckets - 1)];
  }

  // Back to the start of a (restored) generation: a new policy, no marks,
  // no capture.
  void ResetEngine(const v1::JobConfig& config, absl::Span<const uint64_t> resume_steps)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    policy = MakeChunkPolicy(config);
    policy->Restored(resume_steps);
    marks.assign(marks.size(), AcceptedMark{});
    Disarm();
  }

  // Checkpoint capture (ArmCheckpoint, CollectCheckpoint): Capture keeps
  // the state as it is now, TakeCapture moves a kept state into the file
  // (false when there is none yet), Disarm forgets it and any capture armed.
  void Capture(bool sync) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    captured.emplace();
    SnapshotInto(sync, &*captured);
  }
  bool TakeCapture(v1::ShardCheckpointFile* file) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (!captured.has_value()) return false;
    for (v1::ChunkState& c : *captured->mutable_chunks()) *file->add_chunks() = std::move(c);
    for (v1::TableState& t : *captured->mutable_tables()) *file->add_tables() = std::move(t);
    captured.reset();
    return true;
  }
  void Disarm() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    capture_at = 0;
    captured.reset();
  }

  const uint64_t order;
  const std::string name;  // "chunk 3", "table 'emb'": for messages
  absl::Mutex mu;

 protected:
  // The optimizer update itself.
  virtual void Update(const GradientRef& grad, float lr) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) = 0;
  // Adds this target's state now to `into`, for a checkpoint (SnapshotMarks
  // says what `sync` means).
  virtual void SnapshotInto(bool sync, v1::ShardCheckpointFile* into) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) = 0;

  // The dedup marks as a checkpoint keeps them. `sync`: the marks say no
  // more than step version - 1 was applied, because a push for the open step
  // is in its aggregate, which the checkpoint does not keep: after a
  // roll-back that push must be accepted again. ssp: a held gradient is not
  // in the values either; its mark must not say it was applied, and the
  // rank must compute it again (`held_from`).
  void SnapshotMarks(bool sync, google::protobuf::RepeatedPtrField<v1::DedupMark>* out,
                     google::protobuf::Map<uint32_t, uint64_t>* held_from) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    for (uint32_t rank = 0; rank < marks.size(); ++rank) {
      const AcceptedMark& m = marks[rank];
      v1::DedupMark* d = out->Add();
      const bool capped = sync && m.valid && m.step >= version_;
      d->set_valid(m.valid && !(capped && version_ == 0));
      d->set_incarnation(m.incarnation);
      d->set_step(capped && version_ > 0 ? version_ - 1 : m.step);
      if (const std::optional<uint64_t> held = policy->LowestHeldStep(rank);
          held.has_value() && d->valid() && d->step() >= *held) {
        (*held_from)[rank] = *held;
        if (*held == 0)
          d->set_valid(false);
        else
          d->set_step(*held - 1);
      }
    }
  }
  // The marks of a restored state.
  void LoadMarks(const google::protobuf::RepeatedPtrField<v1::DedupMark>& saved)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    for (int r = 0; r < saved.size() && r < static_cast<int>(marks.size()); ++r)
      marks[r] = AcceptedMark{saved[r].valid(), saved[r].incarnation(), saved[r].step()};
  }

  uint64_t version_ ABSL_GUARDED_BY(mu) = 0;

 public:
  std::unique_ptr<ChunkPolicy> policy ABSL_GUARDED_BY(mu);
  std::vector<AcceptedMark> marks ABSL_GUARDED_BY(mu);  // by rank
  ChunkCounters counters ABSL_GUARDED_BY(mu);
  // An armed sync capture: the version at which Apply captures (0: none),
  // and the state captured, until collected.
  uint64_t capture_at ABSL_GUARDED_BY(mu) = 0;
  std::optional<v1::ShardCheckpointFile> captured ABSL_GUARDED_BY(mu);
};

namespace {

// The sum of a sync step or a held ssp gradient of a dense chunk.
class DenseGradientBuffer final : public GradientBuffer {
 public:
  DenseGradientBuffer(Backend* backend, uint64_t n)
      : backend_(backend), n_(n), sum_(backend, n * sizeof(float)) {
    backend_->Fill(sum_.f32(), 0.0f, n_);
  }
  // The first gradient after a Clear is copied, not added to zeros: one
  // pass over the chunk fewer per step.
  void Add(const GradientRef& g) override {
    if (empty_) {
      backend_->CopyOnDevice(sum_.f32(), g.values.data(), n_ * sizeof(float));
      empty_ = false;
    } else {
      backend_->Axpy(1.0f, g.values.data(), sum_.f32(), n_);
    }
  }
  void Scale(float factor) override {
    if (!empty_) backend_->Scale(factor, sum_.f32(), n_);
  }
  // The values are left as they are: the next Add overwrites them.
  void Clear() override { empty_ = true; }
  GradientRef Ref() const override {
    if (empty_) backend_->Fill(sum_.f32(), 0.0f, n_);  // nothing added: zeros
    return GradientRef{absl::MakeConstSpan(sum_.f32(), n_), {}};
  }

 private:
  Backend* const backend_;
  const uint64_t n_;
  mutable DeviceBuffer sum_;  // Ref fills it with zeros when empty
  bool empty_ = true;         // nothing added since the last Clear
};

}  // namespace

// One dense chunk: its values and optimizer, and its checkpoint capture.
class ShardStore::Chunk final : public Target {
 public:
  Chunk(uint32_t id, uint64_t num_elements, std::unique_ptr<Backend> backend,
        const v1::JobConfig& config)
      : Target(id, absl::StrCat("chunk ", id), config),
        id(id),
        num_elements_(num_elements),
        backend_(std::move(backend)) {
    absl::MutexLock lock(&mu);
    values = DeviceBuffer(backend_.get(), num_elements_ * sizeof(float));
    optimizer = std::make_unique<ChunkOptimizer>(config.optimizer(),
                                                 backend_.get(), num_elements_);
  }

  // The policy's buffers came from the backend: they go first.
  ~Chunk() override {
    absl::MutexLock lock(&mu);
    policy.reset();
  }

  uint64_t num_elements() const { return num_elements_; }
  std::unique_ptr<GradientBuffer> NewBuffer() override {
    return std::make_unique<DenseGradientBuffer>(backend_.get(), num_elements_);
  }

  // Replaces the state with `state` (checked by MatchStates), or with the
  // initial values at version 0 when null; drops the mode's pending state.
  absl::Status Reset(const v1::ChunkState* state, const v1::ChunkSpec& spec,
                     const v1::TensorSpec& tensor, const v1::JobConfig& config,
                     absl::Span<const uint64_t> resume_steps)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    ResetEngine(config, resume_steps);
    if (state == nullptr) {
      version_ = 0;
      optimizer->Reset();
      return InitializeRange(tensor, config.seed(), spec.tensor_index(), spec.offset(),
                             spec.num_elements(), values.f32());
    }
    version_ = state->version();
    std::memcpy(values.f32(), state->values().data(), num_elements_ * sizeof(float));
    std::vector<const std::string*> slots;
    for (const std::string& slot : state->optimizer_state()) slots.push_back(&slot);
    optimizer->LoadState(slots);
    LoadMarks(state->marks());
    return absl::OkStatus();
  }

  const uint32_t id;

 protected:
  void Update(const GradientRef& grad, float lr) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    optimizer->Apply(values.f32(), grad.values.data(), lr, version_);
  }
  void SnapshotInto(bool sync, v1::ShardCheckpointFile* into) const override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    v1::ChunkState* out = into->add_chunks();
    out->set_chunk_id(id);
    out->set_version(version_);
    out->set_num_elements(num_elements_);
    out->set_values(reinterpret_cast<const char*>(values.f32()), num_elements_ * sizeof(float));
    for (std::string& slot : optimizer->SaveState()) out->add_optimizer_state(std::move(slot));
    SnapshotMarks(sync, out->mutable_marks(), out->mutable_held_from());
  }

 private:
  const uint64_t num_elements_;
  // Declared before the buffers, which it allocated and must outlive.
  const std::unique_ptr<Backend> backend_;

 public:
  DeviceBuffer values ABSL_GUARDED_BY(mu);
  std::unique_ptr<ChunkOptimizer> optimizer ABSL_GUARDED_BY(mu);
};

// One sparse table's rows on this shard. Locked after every chunk (its
// order is past every chunk id).
class ShardStore::Table final : public Target {
 public:
  Table(uint32_t index, const v1::SparseTableSpec& spec, std::unique_ptr<Backend> backend,
        const v1::JobConfig& config)
      : Target((uint64_t{1} << 32) + index, absl::StrCat("table '", spec.name(), "'"), config),
        spec(spec),
        config_(config),
        backend_(std::move(backend)) {
    absl::MutexLock lock(&mu);
    rows = NewRows();
  }

  // Empty rows of this table (a restore fills them before taking the lock).
  std::unique_ptr<SparseRows> NewRows() const {
    return std::make_unique<SparseRows>(spec, config_.optimizer(), config_.seed(),
                                        backend_.get());
  }

  std::unique_ptr<GradientBuffer> NewBuffer() override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return rows->NewBuffer();
  }

  // Back to `state` with its rows already loaded into `loaded` (Restore), or
  // to the initial values (no rows, version 0) when `state` is null.
  void Reset(const v1::TableState* state, std::unique_ptr<SparseRows> loaded,
             const v1::JobConfig& config, absl::Span<const uint64_t> resume_steps)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    ResetEngine(config, resume_steps);
    if (state == nullptr) {
      rows->Clear();
      version_ = 0;
      return;
    }
    rows = std::move(loaded);
    version_ = state->version();
    LoadMarks(state->marks());
  }

  const v1::SparseTableSpec spec;

 protected:
  void Update(const GradientRef& grad, float lr) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    rows->Apply(grad, lr);
  }
  void SnapshotInto(bool sync, v1::ShardCheckpointFile* into) const override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    v1::TableState* out = into->add_tables();
    out->set_name(spec.name());
    out->set_version(version_);
    rows->Save(out);
    SnapshotMarks(sync, out->mutable_marks(), out->mutable_held_from());
  }

 private:
  const v1::JobConfig& config_;  // the store's, which outlives its tables
  const std::unique_ptr<Backend> backend_;

 public:
  std::unique_ptr<SparseRows> rows ABSL_GUARDED_BY(mu);
  uint64_t rows_pushed ABSL_GUARDED_BY(mu) = 0;  // row gradients taken
  uint64_t rows_pulled ABSL_GUARDED_BY(mu) = 0;  // rows served
};

// Holds the mutexes of a push's targets, taken in ascending order (chunk id,
// then tables) so that two multi-target pushes never deadlock. The targets
// must be distinct.
class ShardStore::ChunkLocks {
 public:
  template <typename T>
  explicit ChunkLocks(const std::vector<T*>& targets) : targets_(targets.begin(), targets.end()) {
    std::sort(targets_.begin(), targets_.end(),
              [](const Target* a, const Target* b) { return a->order < b->order; });
    for (Target* t : targets_) t->mu.Lock();
  }
  ~ChunkLocks() {
    for (auto it = targets_.rbegin(); it != targets_.rend(); ++it)
      (*it)->mu.Unlock();
  }
  ChunkLocks(const ChunkLocks&) = delete;
  ChunkLocks& operator=(const ChunkLocks&) = delete;

 private:
  std::vector<Target*> targets_;
};

// A pull waiting for its targets: the wait is shared, the reading and the
// answer are the kind's own (dense chunks or sparse rows).
struct ShardStore::Waiter {
  virtual ~Waiter() = default;
  // With target i's lock held, every target ready: reads it into the
  // answer. An error fails the pull (nothing is served).
  virtual absl::Status ReadLocked(size_t i, Target& t) = 0;
  // The pull ends with `status` instead of what it read.
  void Fail(absl::Status status) { error = std::move(status); }
  // Called once, outside every lock: hands the answer (what was read, or
  // `error`) to the callback.
  virtual void Finish() = 0;

  const PullWait* wait = nullptr;  // points into the subclass's spec
  std::vector<Target*> targets;
  absl::Time start;
  absl::Status error;
};

struct ShardStore::DenseWaiter final : Waiter {
  absl::Status ReadLocked(size_t i, Target& t) override {
    Chunk& c = static_cast<Chunk&>(t);
    c.mu.AssertHeld();
    PulledChunk& p = pulled[i];
    p.chunk_id = c.id;
    const size_t bytes = c.num_elements() * DTypeSize(spec.dtype);
    char* dst = nullptr;
    if (spec.into.empty()) {
      // Every byte is written below: a pooled buffer needs no clearing.
      p.data = BufferPool::Default().Take(bytes);
      dst = p.data.data();
    } else {
      dst = spec.into[i];
    }
    p.version = c.version();
    ConvertElements(c.values.f32(), DType::kF32, dst, spec.dtype, c.num_elements());
    ++c.counters.pulls;
    c.counters.bytes_out += bytes;
    return absl::OkStatus();
  }
  void Finish() override { error.ok() ? done(std::move(pulled)) : done(std::move(error)); }

  PullSpec spec;
  PullCallback done;
  std::vector<PulledChunk> pulled;
};

struct ShardStore::SparseWaiter final : Waiter {
  absl::Status ReadLocked(size_t, Target& t) override {
    Table& table = static_cast<Table&>(t);
    table.mu.AssertHeld();
    if (absl::Status s = table.rows->Ensure(spec.ids); !s.ok()) return s;
    const size_t n = spec.ids.size() * table.spec.dim();
    thread_local std::vector<float> rows;
    rows.resize(n);
    table.rows->Read(spec.ids, rows.data());
    pulled.version = table.version();
    pulled.data.resize(n * DTypeSize(spec.dtype));
    ConvertElements(rows.data(), DType::kF32, pulled.data.data(), spec.dtype, n);
    ++table.counters.pulls;
    table.counters.bytes_out += pulled.data.size();
    table.rows_pulled += spec.ids.size();
    return absl::OkStatus();
  }
  void Finish() override { error.ok() ? done(std::move(pulled)) : done(std::move(error)); }

  SparsePullSpec spec;
  SparsePullCallback done;
  PulledRows pulled;
};

absl::StatusOr<std::unique_ptr<ShardStore>> ShardStore::Create(
    Options options) {
  if (absl::Status s = ValidateJobConfig(options.config); !s.ok()) return s;
  if (absl::Status s = ValidateShardMap(options.shard_map); !s.ok()) return s;
  if (static_cast<uint32_t>(options.shard_map.shards_size()) !=
      options.config.num_servers())
    return absl::InvalidArgumentError(absl::StrCat(
        "shard map has ", options.shard_map.shards_size(),
        " shards but the job config says num_servers = ",
        options.config.num_servers()));
  if (options.shard >= options.config.num_servers())
    return absl::InvalidArgumentError(
        absl::StrCat("shard ", options.shard, " is out of range: the job has ",
                     options.config.num_servers(), " shards"));
  if (!options.make_backend) options.make_backend = CreateCpuBackend;
  const uint64_t generation = options.generation;
  const uint64_t restored_checkpoint = options.restored_checkpoint;
  std::vector<v1::ChunkState> restore = std::move(options.restore);
  std::vector<v1::TableState> restore_tables = std::move(options.restore_tables);
  std::vector<uint64_t> resume_steps = std::move(options.resume_steps);
  std::unique_ptr<ShardStore> store(new ShardStore(std::move(options)));
  if (absl::Status s = store->Initialize(); !s.ok()) return s;
  if (restored_checkpoint > 0 || generation > 0) {
    if (absl::Status s = store->Restore(generation, restored_checkpoint, restore, resume_steps,
                                        restore_tables);
        !s.ok())
      return s;
  }
  store->timer_ = std::thread([s = store.get()] { s->TimerLoop(); });
  return store;
}

ShardStore::ShardStore(Options options)
    : config_(std::move(options.config)),
      map_(std::move(options.shard_map)),
      shard_(options.shard),
      incarnation_(options.incarnation),
      address_(std::move(options.address)),
      make_backend_(std::move(options.make_backend)),
      num_workers_(config_.num_workers()),
      max_waiting_pulls_(options.max_waiting_pulls > 0
                             ? options.max_waiting_pulls
                             : kWaitingPullsPerWorker * std::max(1u, num_workers_)) {
  absl::MutexLock lock(&members_mu_);
  live_ = std::make_shared<const LiveSet>(LiveSet::All(num_workers_));
}

ShardStore::~ShardStore() {
  Shutdown();
  {
    absl::MutexLock lock(&waiters_mu_);
    stop_timer_ = true;
    timer_wake_.SignalAll();
  }
  if (timer_.joinable()) timer_.join();
}

absl::Status ShardStore::Initialize() {
  local_index_.assign(map_.chunks_size(), -1);
  for (const v1::ChunkSpec& spec : map_.chunks()) {
    if (spec.shard() != shard_) continue;
    std::unique_ptr<Backend> backend = make_backend_();
    if (backend == nullptr || backend->IsCuda())
      return absl::InvalidArgumentError(
          "the shard store needs a host-memory backend for its chunks");
    auto chunk = std::make_unique<Chunk>(spec.chunk_id(), spec.num_elements(),
                                         std::move(backend), config_);
    {
      absl::MutexLock lock(&chunk->mu);
      if (absl::Status s = InitializeRange(
              map_.tensors(spec.tensor_index()), config_.seed(),
              spec.tensor_index(), spec.offset(), spec.num_elements(),
              chunk->values.f32());
          !s.ok())
        return absl::InvalidArgumentError(
            absl::StrCat("chunk ", spec.chunk_id(), ": ", s.message()));
    }
    local_index_[spec.chunk_id()] = static_cast<int>(chunks_.size());
    chunk_ids_.push_back(spec.chunk_id());
    chunks_.push_back(std::move(chunk));
  }
  for (int i = 0; i < config_.sparse_tables_size(); ++i) {
    std::unique_ptr<Backend> backend = make_backend_();
    if (backend == nullptr || backend->IsCuda())
      return absl::InvalidArgumentError(
          "the shard store needs a host-memory backend for its tables");
    tables_.push_back(std::make_unique<Table>(i, config_.sparse_tables(i), std::move(backend),
                                              config_));
  }
  return absl::OkStatus();
}

ShardStore::Table* ShardStore::FindTable(std::string_view name) const {
  for (const std::unique_ptr<Table>& t : tables_)
    if (t->spec.name() == name) return t.get();
  return nullptr;
}

std::vector<ShardStore::Target*> ShardStore::AllTargets() const {
  std::vector<Target*> all;
  all.reserve(chunks_.size() + tables_.size());
  for (const std::unique_ptr<Chunk>& c : chunks_) all.push_back(c.get());
  for (const std::unique_ptr<Table>& t : tables_) all.push_back(t.get());
  return all;
}

ShardStore::Chunk* ShardStore::FindChunk(uint32_t chunk_id) const {
  if (chunk_id >= local_index_.size() || local_index_[chunk_id] < 0)
    return nullptr;
  return chunks_[local_index_[chunk_id]].get();
}

std::shared_ptr<const LiveSet> ShardStore::live() const {
  absl::MutexLock lock(&members_mu_);
  return live_;
}

absl::Status ShardStore::CheckIncarnation(uint32_t rank,
                                          uint64_t incarnation) const {
  absl::MutexLock lock(&members_mu_);
  const uint64_t known = live_->incarnations[rank];
  if (incarnation < known)
    return absl::FailedPreconditionError(absl::StrCat(
        "stale incarnation: worker ", rank, " pushed as incarnation ",
        incarnation, " but incarnation ", known, " is current"));
  return absl::OkStatus();
}

void ShardStore::RaiseIncarnation(uint32_t rank, uint64_t incarnation) {
  absl::MutexLock lock(&members_mu_);
  if (incarnation <= live_->incarnations[rank]) return;
  auto updated = std::make_shared<LiveSet>(*live_);
  updated->incarnations[rank] = incarnation;
  live_ = std::move(updated);
}

absl::StatusOr<ShardStore::PushResult> ShardStore::Push(
    const GradientPush& push) {
  if (shutdown_.load())
    return absl::UnavailableError("shard is shutting down");
  // The edge has checked all of this; a violation here is a caller bug that
  // must not become out-of-bounds access.
  if (push.worker_rank >= num_workers_)
    return absl::InvalidArgumentError(
        absl::StrCat("unknown worker rank ", push.worker_rank));
  std::vector<Chunk*> chunks;
  chunks.reserve(push.chunks.size());
  for (const ChunkGradient& g : push.chunks) {
    Chunk* c = FindChunk(g.chunk_id);
    if (c == nullptr)
      return absl::NotFoundError(absl::StrCat(
          "chunk ", g.chunk_id, " is not held by shard ", shard_));
    if (g.values.size() != c->num_elements())
      return absl::InvalidArgumentError(absl::StrCat(
          "chunk ", g.chunk_id, ": ", g.values.size(),
          " gradient values for ", c->num_elements(), " elements"));
    chunks.push_back(c);
  }
  std::vector<Chunk*> sorted = chunks;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())
    return absl::InvalidArgumentError("a chunk appears twice in one push");

  if (absl::Status s = CheckIncarnation(push.worker_rank, push.incarnation);
      !s.ok()) {
    rejected_.fetch_add(push.chunks.size());
    return s;
  }
  const std::shared_ptr<const LiveSet> live_set = live();
  const std::vector<Target*> targets(chunks.begin(), chunks.end());
  std::vector<GradientRef> grads;
  std::vector<uint64_t> base_versions;
  std::vector<uint64_t> wire_bytes;
  for (const ChunkGradient& g : push.chunks) {
    grads.push_back(GradientRef{g.values, {}});
    base_versions.push_back(g.base_version);
    wire_bytes.push_back(g.wire_bytes);
  }
  PushResult result;
  {
    ChunkLocks locks(chunks);
    // Under the chunks' locks, so a Restore is wholly before or after.
    if (absl::Status s = CheckGeneration(push.generation); !s.ok()) return s;
    std::vector<bool> duplicate;
    if (absl::Status s = DecideLocked(push.worker_rank, push.incarnation, push.step, targets,
                                      base_versions, &duplicate);
        !s.ok())
      return s;
    for (const Outcome& o : AcceptLocked(push.worker_rank, push.incarnation, push.step, targets,
                                         grads, base_versions, wire_bytes, duplicate,
                                         *live_set)) {
      result.versions.push_back(o.version);
      result.duplicates += o.duplicate;
      result.late += o.late;
      result.too_stale += o.too_stale;
    }
  }
  RaiseIncarnation(push.worker_rank, push.incarnation);
  WakeWaiters();
  return result;
}

absl::Status ShardStore::DecideLocked(uint32_t rank, uint64_t incarnation, uint64_t step,
                                      absl::Span<Target* const> targets,
                                      absl::Span<const uint64_t> base_versions,
                                      std::vector<bool>* duplicate) {
  duplicate->assign(targets.size(), false);
  for (size_t i = 0; i < targets.size(); ++i) {
    Target& t = *targets[i];
    t.mu.AssertHeld();
    const AcceptedMark& mark = t.marks[rank];
    if (mark.valid && incarnation < mark.incarnation) {
      rejected_.fetch_add(targets.size());
      return absl::FailedPreconditionError(absl::StrCat(
          "stale incarnation: worker ", rank, " pushed as incarnation ", incarnation,
          " but incarnation ", mark.incarnation, " already pushed to ", t.name));
    }
    // A step of the rank this target has applied already, from this
    // incarnation (a retry) or an earlier one (a restarted worker resumes
    // from its rank's last reported step, which may be behind its last
    // push): acknowledged, not applied again. Exactly once across
    // incarnations, per target: a step that reached one shard and not
    // another before the worker died is applied where it was missing.
    if (mark.valid && step <= mark.step) {
      (*duplicate)[i] = true;
      continue;
    }
    const ChunkGradientMeta meta{rank, incarnation, step, base_versions[i]};
    if (absl::Status s = t.policy->Check(meta, t); !s.ok()) {
      rejected_.fetch_add(targets.size());
      return absl::Status(s.code(), absl::StrCat(t.name, ": ", s.message()));
    }
  }
  return absl::OkStatus();
}

std::vector<ShardStore::Outcome> ShardStore::AcceptLocked(
    uint32_t rank, uint64_t incarnation, uint64_t step, absl::Span<Target* const> targets,
    absl::Span<const GradientRef> grads, absl::Span<const uint64_t> base_versions,
    absl::Span<const uint64_t> wire_bytes, const std::vector<bool>& duplicate,
    const LiveSet& live_set) {
  std::vector<Outcome> outcomes(targets.size());
  for (size_t i = 0; i < targets.size(); ++i) {
    Target& t = *targets[i];
    t.mu.AssertHeld();
    Outcome& o = outcomes[i];
    const ChunkGradientMeta meta{rank, incarnation, step, base_versions[i]};
    ++t.counters.pushes;
    t.counters.bytes_in += wire_bytes[i];
    if (duplicate[i]) {
      ++t.counters.duplicates;
      o.duplicate = true;
      t.policy->Duplicate(meta, t, live_set);
      o.version = t.version();
      continue;
    }
    // Marked before Accept: an update it applies may be captured by a
    // checkpoint, which must know this push as applied.
    t.marks[rank] = AcceptedMark{true, incarnation, step};
    const GradientFate fate = t.policy->Accept(meta, grads[i], t, live_set);
    switch (fate) {
      case GradientFate::kLateFolded:
        ++t.counters.late_folded;
        break;
      case GradientFate::kLateDropped:
        ++t.counters.late_dropped;
        break;
      case GradientFate::kTooStale:
        ++t.counters.too_stale;
        o.too_stale = true;
        rejected_.fetch_add(1);
        break;
      default:
        break;
    }
    if (IsLate(fate)) {
      ++t.counters.late_by_worker[rank];
      o.late = true;
    }
    o.version = fate == GradientFate::kAggregated ? base_versions[i] + 1 : t.version();
  }
  return outcomes;
}

absl::StatusOr<ShardStore::SparsePushResult> ShardStore::PushSparse(
    const SparseGradientPush& push) {
  if (shutdown_.load())
    return absl::UnavailableError("shard is shutting down");
  // The edge has checked all of this; see Push.
  if (push.worker_rank >= num_workers_)
    return absl::InvalidArgumentError(
        absl::StrCat("unknown worker rank ", push.worker_rank));
  Table* table = FindTable(push.table);
  if (table == nullptr)
    return absl::NotFoundError(absl::StrCat("the job has no sparse table '", push.table, "'"));
  if (push.values.size() != push.ids.size() * table->spec.dim())
    return absl::InvalidArgumentError(absl::StrCat(
        table->name, ": ", push.values.size(), " gradient values for ", push.ids.size(),
        " rows of ", table->spec.dim()));
  if (absl::Status s = CheckIncarnation(push.worker_rank, push.incarnation); !s.ok()) {
    rejected_.fetch_add(1);
    return s;
  }
  const std::shared_ptr<const LiveSet> live_set = live();
  Target* const targets[] = {table};
  const GradientRef grads[] = {GradientRef{push.values, push.ids}};
  const uint64_t base_versions[] = {push.base_version};
  const uint64_t wire_bytes[] = {push.wire_bytes};
  Outcome outcome;
  {
    absl::MutexLock lock(&table->mu);
    if (absl::Status s = CheckGeneration(push.generation); !s.ok()) return s;
    std::vector<bool> duplicate;
    if (absl::Status s = DecideLocked(push.worker_rank, push.incarnation, push.step, targets,
                                      base_versions, &duplicate);
        !s.ok())
      return s;
    if (!duplicate[0]) {
      // The rows' limit is decided before the push is taken: all or nothing.
      if (absl::Status s = table->rows->Ensure(push.ids); !s.ok()) {
        rejected_.fetch_add(1);
        return s;
      }
      table->rows->CountPushed(push.ids);
      table->rows_pushed += push.ids.size();
    }
    outcome = AcceptLocked(push.worker_rank, push.incarnation, push.step, targets, grads,
                           base_versions, wire_bytes, duplicate, *live_set)[0];
  }
  RaiseIncarnation(push.worker_rank, push.incarnation);
  WakeWaiters();
  return SparsePushResult{outcome.version, outcome.duplicate, outcome.late, outcome.too_stale};
}

absl::Status ShardStore::CheckPuller(uint32_t rank) const {
  if (shutdown_.load()) return absl::UnavailableError("shard is shutting down");
  if (rank >= num_workers_)
    return absl::InvalidArgumentError(absl::StrCat("unknown worker rank ", rank));
  return absl::OkStatus();
}

void ShardStore::PullAsync(PullSpec spec, PullCallback done) {
  if (absl::Status s = CheckPuller(spec.worker_rank); !s.ok()) {
    done(s);
    return;
  }
  auto w = std::make_unique<DenseWaiter>();
  if (spec.chunk_ids.empty()) spec.chunk_ids = chunk_ids_;
  for (uint32_t id : spec.chunk_ids) {
    Chunk* c = FindChunk(id);
    if (c == nullptr) {
      done(absl::NotFoundError(
          absl::StrCat("chunk ", id, " is not held by shard ", shard_)));
      return;
    }
    w->targets.push_back(c);
  }
  if (!spec.into.empty() && spec.into.size() != spec.chunk_ids.size()) {
    done(absl::InvalidArgumentError("a pull's destinations do not match its chunks"));
    return;
  }
  w->pulled.resize(w->targets.size());
  w->spec = std::move(spec);
  w->wait = &w->spec;
  w->done = std::move(done);
  AddWaiter(std::move(w));
}

void ShardStore::PullSparseAsync(SparsePullSpec spec, SparsePullCallback done) {
  if (absl::Status s = CheckPuller(spec.worker_rank); !s.ok()) {
    done(s);
    return;
  }
  Table* table = FindTable(spec.table);
  if (table == nullptr) {
    done(absl::NotFoundError(absl::StrCat("the job has no sparse table '", spec.table, "'")));
    return;
  }
  auto w = std::make_unique<SparseWaiter>();
  w->targets.push_back(table);
  w->spec = std::move(spec);
  w->wait = &w->spec;
  w->done = std::move(done);
  AddWaiter(std::move(w));
}

void ShardStore::AddWaiter(std::unique_ptr<Waiter> w) {
  w->start = absl::Now();
  bool full;
  {
    absl::MutexLock lock(&waiters_mu_);
    full = waiters_.size() + in_scan_ >= max_waiting_pulls_;
    if (!full) {
      if (w->wait->deadline < timer_at_) timer_wake_.Signal();
      waiters_.push_back(std::move(w));
    }
  }
  if (full) {  // answered outside the lock
    w->Fail(absl::ResourceExhaustedError(
        absl::StrCat("shard ", shard_, " has ", max_waiting_pulls_,
                     " pulls waiting already (its limit); try again later")));
    w->Finish();
    return;
  }
  WakeWaiters();
}

absl::StatusOr<ShardStore::PulledRows> ShardStore::PullSparse(SparsePullSpec spec) {
  absl::Notification answered;
  absl::StatusOr<PulledRows> out;
  PullSparseAsync(std::move(spec), [&](absl::StatusOr<PulledRows> r) {
    out = std::move(r);
    answered.Notify();
  });
  answered.WaitForNotification();
  return out;
}

absl::StatusOr<std::vector<float>> ShardStore::TEST_ReadRow(const std::string& table,
                                                            int64_t id) const {
  Table* t = FindTable(table);
  if (t == nullptr) return absl::NotFoundError(absl::StrCat("no table '", table, "'"));
  absl::MutexLock lock(&t->mu);
  const float* row = t->rows->TEST_Row(id);
  if (row == nullptr) return absl::NotFoundError(absl::StrCat("no row ", id));
  return std::vector<float>(row, row + t->spec.dim());
}

absl::StatusOr<std::vector<ShardStore::PulledChunk>> ShardStore::Pull(
    PullSpec spec) {
  absl::Notification answered;
  absl::StatusOr<std::vector<PulledChunk>> out;
  PullAsync(std::move(spec), [&](absl::StatusOr<std::vector<PulledChunk>> r) {
    out = std::move(r);
    answered.Notify();
  });
  answered.WaitForNotification();
  return out;
}

absl::StatusOr<std::vector<ShardStore::PulledChunk>> ShardStore::Pull(
    absl::Span<const uint32_t> chunk_ids, uint64_t min_version,
    absl::Time deadline, DType dtype) {
  PullSpec spec;
  spec.chunk_ids.assign(chunk_ids.begin(), chunk_ids.end());
  spec.min_version = min_version;
  spec.deadline = deadline;
  spec.dtype = dtype;
  return Pull(std::move(spec));
}

bool ShardStore::TryServe(Waiter& w) {
  const PullWait& spec = *w.wait;
  if (shutdown_.load()) {
    w.Fail(absl::UnavailableError("shard is shutting down"));
    return true;
  }
  if (spec.cancelled != nullptr && spec.cancelled->load()) {
    w.Fail(absl::CancelledError("the pull was cancelled"));
    return true;
  }
  if (absl::Status s = CheckGeneration(spec.generation); !s.ok()) {
    w.Fail(s);
    return true;
  }
  const std::shared_ptr<const LiveSet> live_set = live();
  // First check every target (one lock at a time), then read: readiness
  // only grows while the puller waits, so a pull that fails serves nothing.
  Target* blocking = nullptr;
  uint64_t blocking_version = 0;
  for (Target* t : w.targets) {
    absl::MutexLock lock(&t->mu);
    const bool ready =
        t->version() >= spec.min_version &&
        (!spec.clock.has_value() ||
         t->policy->ReadyToServe(spec.worker_rank, *spec.clock, *t, *live_set));
    if (!ready) {
      blocking = t;
      blocking_version = t->version();
      break;
    }
  }
  if (blocking != nullptr) {
    const absl::Time now = absl::Now();
    if (now < spec.deadline) return false;
    w.Fail(absl::DeadlineExceededError(absl::StrCat(
        blocking->name, " is at version ", blocking_version,
        spec.clock.has_value()
            ? absl::StrCat(", not yet readable at clock ", *spec.clock,
                           " of worker ", spec.worker_rank)
            : std::string(),
        spec.min_version > 0 ? absl::StrCat(", wanted >= ", spec.min_version)
                             : std::string(),
        " (waited ", absl::ToInt64Milliseconds(now - w.start), " ms)")));
    return true;
  }
  bool applied = false;
  for (size_t i = 0; i < w.targets.size(); ++i) {
    Target& t = *w.targets[i];
    absl::MutexLock lock(&t.mu);
    if (absl::Status s = w.ReadLocked(i, t); !s.ok()) {
      w.Fail(s);
      break;
    }
    applied |= spec.clock.has_value()
                   ? t.policy->Served(spec.worker_rank, *spec.clock, t, *live_set)
                   : t.policy->ServedWithoutClock(spec.worker_rank, t, *live_set);
  }
  if (applied) {
    absl::MutexLock lock(&waiters_mu_);
    look_again_ = true;
  }
  return true;
}

void ShardStore::WakeWaiters() {
  {
    absl::MutexLock lock(&waiters_mu_);
    look_again_ = true;
    if (scanning_) return;  // that thread will look again
    scanning_ = true;
  }
  while (true) {
    std::vector<std::unique_ptr<Waiter>> batch;
    {
      absl::MutexLock lock(&waiters_mu_);
      if (!look_again_) {
        scanning_ = false;
        return;
      }
      look_again_ = false;
      batch.swap(waiters_);
      in_scan_ = batch.size();
    }
    std::vector<std::unique_ptr<Waiter>> still_waiting;
    std::vector<std::unique_ptr<Waiter>> answered;
    for (std::unique_ptr<Waiter>& w : batch) {
      if (TryServe(*w)) {
        answered.push_back(std::move(w));
      } else {
        still_waiting.push_back(std::move(w));
      }
    }
    {
      absl::MutexLock lock(&waiters_mu_);
      bool sooner = false;
      for (std::unique_ptr<Waiter>& w : still_waiting) {
        sooner |= w->wait->deadline < timer_at_;
        waiters_.push_back(std::move(w));
      }
      in_scan_ = 0;
      if (sooner) timer_wake_.Signal();
    }
    for (std::unique_ptr<Waiter>& w : answered) w->Finish();
  }
}

void ShardStore::TimerLoop() {
  absl::MutexLock lock(&waiters_mu_);
  while (!stop_timer_) {
    absl::Time next = absl::InfiniteFuture();
    for (const std::unique_ptr<Waiter>& w : waiters_)
      next = std::min(next, w->wait->deadline);
    if (next > absl::Now()) {
      timer_at_ = next;
      timer_wake_.WaitWithDeadline(&waiters_mu_, next);
      timer_at_ = absl::InfinitePast();  // awake: it looks at every waiter
      continue;
    }
    waiters_mu_.Unlock();
    WakeWaiters();
    waiters_mu_.Lock();
    // A waiter past its deadline may still be in another thread's scan;
    // give that thread a moment rather than spin.
    timer_at_ = absl::Now() + absl::Milliseconds(1);
    timer_wake_.WaitWithTimeout(&waiters_mu_, absl::Milliseconds(1));
    timer_at_ = absl::InfinitePast();
  }
}

absl::StatusOr<ShardStore::ChunkValues> ShardStore::TEST_ReadChunk(
    uint32_t chunk_id) const {
  Chunk* c = FindChunk(chunk_id);
  if (c == nullptr)
    return absl::NotFoundError(
        absl::StrCat("chunk ", chunk_id, " is not held by shard ", shard_));
  absl::MutexLock lock(&c->mu);
  ChunkValues out;
  out.version = c->version();
  out.values.assign(c->values.f32(), c->values.f32() + c->num_elements());
  return out;
}

void ShardStore::SetLiveWorkers(absl::Span<const uint32_t> ranks,
                                absl::Span<const uint64_t> incarnations) {
  std::shared_ptr<const LiveSet> live_set;
  {
    absl::MutexLock lock(&members_mu_);
    auto updated = std::make_shared<LiveSet>(*live_);
    updated->live.assign(num_workers_, false);
    updated->count = 0;
    for (size_t i = 0; i < ranks.size(); ++i) {
      const uint32_t r = ranks[i];
      if (r >= num_workers_ || updated->live[r]) continue;
      updated->live[r] = true;
      ++updated->count;
      if (i < incarnations.size())
        updated->incarnations[r] =
            std::max(updated->incarnations[r], incarnations[i]);
    }
    live_ = updated;
    live_set = std::move(updated);
  }
  for (Target* t : AllTargets()) {
    absl::MutexLock lock(&t->mu);
    t->policy->LiveSetChanged(*t, *live_set);
  }
  WakeWaiters();
}

absl::Status ShardStore::CheckGeneration(uint64_t generation) const {
  const uint64_t current = generation_.load();
  if (generation == 0 || generation == current) return absl::OkStatus();
  if (generation < current)
    return absl::AbortedError(absl::StrCat(
        "the job rolled back to checkpoint ", restored_checkpoint_.load(), " (generation ",
        current, "); this request belongs to generation ", generation,
        ": resume from the coordinator's restore order"));
  return absl::UnavailableError(absl::StrCat("shard ", shard_, " is still in generation ",
                                             current, ", not yet ", generation, "; retry"));
}

absl::StatusOr<std::vector<const v1::ChunkState*>> ShardStore::MatchStates(
    const std::vector<v1::ChunkState>& states) const {
  std::vector<const v1::ChunkState*> by_chunk(chunks_.size(), nullptr);
  if (states.empty()) return by_chunk;
  for (const v1::ChunkState& state : states) {
    Chunk* c = FindChunk(state.chunk_id());
    if (c == nullptr) continue;  // another shard's chunk (a re-sharded restore)
    const int index = local_index_[state.chunk_id()];
    auto bad = [&](auto... why) {
      return absl::InvalidArgumentError(absl::StrCat("chunk ", c->id, ": ", why...));
    };
    if (by_chunk[index] != nullptr) return bad("appears twice in the checkpoint");
    if (state.num_elements() != c->num_elements() ||
        state.values().size() != c->num_elements() * sizeof(float))
      return bad("the checkpoint has ", state.values().size(), " bytes of values, the chunk ",
                 c->num_elements(), " elements");
    std::vector<const std::string*> slots;
    for (const std::string& slot : state.optimizer_state()) slots.push_back(&slot);
    absl::MutexLock lock(&c->mu);
    if (absl::Status s = c->optimizer->CheckState(slots); !s.ok()) return bad(s.message());
    by_chunk[index] = &state;
  }
  for (size_t i = 0; i < chunks_.size(); ++i)
    if (by_chunk[i] == nullptr)
      return absl::InvalidArgumentError(
          absl::StrCat("the checkpoint has no state for chunk ", chunks_[i]->id));
  return by_chunk;
}

absl::StatusOr<std::vector<ShardStore::LoadedTable>> ShardStore::LoadTables(
    const std::vector<v1::TableState>& states, bool required) const {
  std::vector<LoadedTable> loaded(tables_.size());
  for (const v1::TableState& state : states) {
    auto it = std::find_if(tables_.begin(), tables_.end(), [&](const auto& t) {
      return t->spec.name() == state.name();
    });
    if (it == tables_.end())
      return absl::InvalidArgumentError(
          absl::StrCat("the checkpoint has a sparse table '", state.name(), "' this job has not"));
    const Table& t = **it;
    LoadedTable& out = loaded[it - tables_.begin()];
    if (out.state != nullptr)
      return absl::InvalidArgumentError(absl::StrCat(t.name, " appears twice in the checkpoint"));
    for (int64_t id : state.ids())
      if (!SparseIdInRange(t.spec, id) || SparseShardOf(id, config_.num_servers()) != shard_)
        return absl::InvalidArgumentError(absl::StrCat(
            t.name, ": the checkpoint gives shard ", shard_, " row ", id,
            ", which is out of the table's range or another shard's"));
    out.state = &state;
    out.rows = t.NewRows();
    if (absl::Status s = out.rows->Load(state); !s.ok()) return s;
  }
  for (size_t i = 0; required && i < loaded.size(); ++i)
    if (loaded[i].state == nullptr)
      return absl::InvalidArgumentError(
          absl::StrCat("the checkpoint has no state for ", tables_[i]->name));
  return loaded;
}

absl::Status ShardStore::Restore(uint64_t generation, uint64_t checkpoint_id,
                                 const std::vector<v1::ChunkState>& states,
                                 absl::Span<const uint64_t> resume_steps,
                                 const std::vector<v1::TableState>& tables) {
  absl::StatusOr<std::vector<const v1::ChunkState*>> matched = MatchStates(states);
  if (!matched.ok()) return matched.status();
  absl::StatusOr<std::vector<LoadedTable>> loaded =
      LoadTables(tables, /*required=*/checkpoint_id > 0);
  if (!loaded.ok()) return loaded.status();
  {
    ChunkLocks locks(AllTargets());
    if (generation_.load() > 0 && generation <= generation_.load())
      return absl::FailedPreconditionError(absl::StrCat(
          "generation ", generation, " is not newer than the shard's ", generation_.load()));
    const std::shared_ptr<const LiveSet> live_set = live();
    for (size_t i = 0; i < chunks_.size(); ++i) {
      Chunk& c = *chunks_[i];
      c.mu.AssertHeld();
      const v1::ChunkSpec& spec = map_.chunks(c.id);
      if (absl::Status s = c.Reset((*matched)[i], spec, map_.tensors(spec.tensor_index()),
                                   config_, resume_steps);
          !s.ok())
        return absl::InternalError(absl::StrCat("chunk ", c.id, ": ", s.message()));
      c.policy->LiveSetChanged(c, *live_set);
    }
    for (size_t i = 0; i < tables_.size(); ++i) {
      Table& t = *tables_[i];
      t.mu.AssertHeld();
      LoadedTable& l = (*loaded)[i];
      t.Reset(l.state, std::move(l.rows), config_, resume_steps);
      t.policy->LiveSetChanged(t, *live_set);
    }
    generation_.store(generation);
    restored_checkpoint_.store(checkpoint_id);
  }
  WakeWaiters();
  return absl::OkStatus();
}

absl::StatusOr<v1::ShardCheckpointFile> ShardStore::CaptureCheckpoint(
    const v1::CheckpointRequest& request, absl::Time deadline) {
  if (absl::Status s = ArmCheckpoint(request); !s.ok()) return s;
  return CollectCheckpoint(request.id(), deadline);
}

absl::Status ShardStore::ArmCheckpoint(const v1::CheckpointRequest& request) {
  absl::MutexLock capture(&capture_mu_);
  capture_epoch_.fetch_add(1);
  const uint64_t at = request.version();
  absl::Status armed;
  const std::vector<Target*> targets = AllTargets();
  for (Target* t : targets) {
    absl::MutexLock lock(&t->mu);
    t->Disarm();
    if (at == 0 || t->version() == at) {
      t->Capture(/*sync=*/at > 0);
    } else if (t->version() > at) {
      armed = absl::FailedPreconditionError(absl::StrCat(
          t->name, " is already at version ", t->version(), ", past the checkpoint's ", at));
      break;  // DisarmAll below
    } else {
      t->capture_at = at;
    }
  }
  if (!armed.ok()) {
    DisarmAll();
    armed_.reset();
    return armed;
  }
  armed_ = request;
  armed_generation_ = generation_.load();
  return absl::OkStatus();
}

absl::StatusOr<v1::ShardCheckpointFile> ShardStore::CollectCheckpoint(uint64_t id,
                                                                     absl::Time deadline) {
  v1::CheckpointRequest request;
  uint64_t generation = 0;
  uint64_t epoch = 0;
  {
    absl::MutexLock capture(&capture_mu_);
    // Under capture_mu_, as ArmCheckpoint bumps it: the epoch of this arm.
    epoch = capture_epoch_.load();
    if (!armed_.has_value() || armed_->id() != id)
      return absl::AbortedError(absl::StrCat("checkpoint ", id, " was superseded"));
    request = *armed_;
    generation = armed_generation_;
    armed_.reset();
  }
  v1::ShardCheckpointFile file;
  file.set_job_id(config_.job_id());
  file.set_checkpoint_id(request.id());
  file.set_shard(shard_);
  absl::Status stop;
  for (Target* t : AllTargets()) {
    while (stop.ok()) {
      {
        absl::MutexLock lock(&t->mu);
        // A newer arm may have put its own capture here already: the epoch
        // is checked under the target's lock, which that arm takes after
        // bumping it.
        if (capture_epoch_.load() != epoch)
          return absl::AbortedError(absl::StrCat("checkpoint ", request.id(),
                                                 " was superseded by a newer one"));
        if (t->TakeCapture(&file)) break;
      }
      if (capture_epoch_.load() != epoch)
        return absl::AbortedError(absl::StrCat("checkpoint ", request.id(),
                                               " was superseded by a newer one"));
      if (generation_.load() != generation)
        stop = absl::AbortedError("the shard was rolled back while checkpointing");
      else if (shutdown_.load())
        stop = absl::UnavailableError("shard is shutting down");
      else if (absl::Now() >= deadline)
        stop = absl::DeadlineExceededError(absl::StrCat(
            t->name, " did not reach version ", request.version(), " in time"));
      else
        absl::SleepFor(absl::Milliseconds(1));
    }
  }
  if (!stop.ok()) {
    DisarmAll();
    return stop;
  }
  return file;
}

void ShardStore::DisarmAll() {
  for (Target* t : AllTargets()) {
    absl::MutexLock lock(&t->mu);
    t->Disarm();
  }
}

void ShardStore::SetCheckpointReport(const v1::ShardCheckpoint& report) {
  absl::MutexLock lock(&report_mu_);
  report_ = report;
}

void ShardStore::CountRejectedAtEdge(uint64_t chunk_gradients) {
  rejected_.fetch_add(chunk_gradients);
}

v1::ShardStatus ShardStore::ShardStatus() const {
  v1::ShardStatus s;
  s.set_shard(shard_);
  s.set_address(address_);
  s.set_incarnation(incarnation_);
  s.set_num_chunks(chunks_.size());
  ChunkCounters total;
  uint64_t elements = 0;
  uint64_t held = 0;
  uint64_t min_version = std::numeric_limits<uint64_t>::max();
  for (const std::unique_ptr<Chunk>& chunk : chunks_) {
    Chunk& c = *chunk;
    absl::MutexLock lock(&c.mu);
    elements += c.num_elements();
    min_version = std::min(min_version, c.version());
    held += c.policy->held();
    total.Add(c.counters);
  }
  for (const std::unique_ptr<Table>& table : tables_) {
    Table& t = *table;
    absl::MutexLock lock(&t.mu);
    held += t.policy->held();
    total.Add(t.counters);
    v1::SparseTableStatus* ts = s.add_tables();
    ts->set_name(t.spec.name());
    ts->set_dim(t.spec.dim());
    ts->set_version(t.version());
    ts->set_rows(t.rows->size());
    ts->set_bytes(t.rows->bytes());
    ts->set_bytes_per_row(t.rows->size() == 0 ? 0.0
                                             : static_cast<double>(t.rows->bytes()) /
                                                   static_cast<double>(t.rows->size()));
    ts->set_rows_pushed(t.rows_pushed);
    ts->set_rows_pulled(t.rows_pulled);
    ts->set_hottest_share(t.rows->hottest_share());
    ts->set_max_rows_per_shard(t.spec.max_rows_per_shard());
  }
  // The chunks' version (each table reports its own).
  if (chunks_.empty()) min_version = 0;
  s.set_version(min_version);
  s.set_num_elements(elements);
  s.set_bytes_in(total.bytes_in);
  s.set_bytes_out(total.bytes_out);
  s.set_updates_applied(total.updates);
  s.set_pushes(total.pushes);
  s.set_pulls(total.pulls);
  s.set_duplicate_pushes(total.duplicates);
  s.set_rejected_pushes(rejected_.load());
  s.set_staleness_mean(total.staleness_count == 0
                           ? 0.0
                           : static_cast<double>(total.staleness_sum) /
                                 static_cast<double>(total.staleness_count));
  s.set_staleness_max(total.staleness_max);
  for (int i = 0; i < kStalenessBuckets; ++i)
    s.add_staleness_histogram(total.staleness_histogram[i]);
  s.set_late_gradients(total.late_folded + total.late_dropped);
  s.set_late_folded(total.late_folded);
  s.set_late_dropped(total.late_dropped);
  s.set_too_stale(total.too_stale);
  for (uint64_t n : total.late_by_worker) s.add_late_by_worker(n);
  s.set_held_gradients(held);
  s.set_generation(generation_.load());
  s.set_restored_checkpoint(restored_checkpoint_.load());
  {
    absl::MutexLock lock(&report_mu_);
    if (report_.id() > 0) *s.mutable_checkpoint() = report_;
  }
  {
    absl::MutexLock lock(&waiters_mu_);
    s.set_waiting_pulls(waiters_.size() + in_scan_);
  }
  return s;
}

void ShardStore::Shutdown() {
  shutdown_.store(true);
  WakeWaiters();
}

}  // namespace grps
