#include "server/shard_store.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "job/initializer.h"
#include "job/job_config.h"
#include "job/shard_map.h"

namespace grps {

// Consistency rules.
//
// Sync (BSP). A chunk at version v is aggregating step v. A gradient for
// step s:
//   s == v      added to the step's sum once per rank; a second push by the
//               same rank is a duplicate (acknowledged, not added). When the
//               contributors cover every live worker the step is applied once
//               from sum / contributors and the version becomes v + 1.
//   s == v - 1  a retry from a rank that contributed to step v - 1: a
//               duplicate. From any other rank: a late gradient, rejected.
//   otherwise   rejected (FAILED_PRECONDITION).
// A rank outside the live set may still contribute (a restarted worker the
// heartbeat has not reported yet); the average counts it.
//
// Async (ASP; SSP is handled the same way for now). Every gradient is
// applied on arrival. Its staleness is the chunk's version minus the version
// the gradient was computed on; with max_staleness > 0 a staler gradient is
// rejected. A push whose (incarnation, step) is not newer than the last one
// applied from the same rank to the chunk is a duplicate, so a worker pushes
// a chunk's steps in order.

namespace {

// The newest push of one rank applied to one chunk (async deduplication).
struct AppliedMark {
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
  uint64_t staleness_count = 0;
  uint64_t staleness_sum = 0;
  uint64_t staleness_max = 0;
  uint64_t staleness_histogram[ShardStore::kStalenessBuckets] = {};

  void Add(const ChunkCounters& o) {
    pushes += o.pushes;
    duplicates += o.duplicates;
    updates += o.updates;
    pulls += o.pulls;
    bytes_in += o.bytes_in;
    bytes_out += o.bytes_out;
    staleness_count += o.staleness_count;
    staleness_sum += o.staleness_sum;
    staleness_max = std::max(staleness_max, o.staleness_max);
    for (int i = 0; i < ShardStore::kStalenessBuckets; ++i)
      staleness_histogram[i] += o.staleness_histogram[i];
  }
};

}  // namespace

struct ShardStore::Chunk {
  Chunk(uint32_t id, uint64_t num_elements, std::unique_ptr<Backend> backend)
      : id(id), num_elements(num_elements), backend(std::move(backend)) {}

  const uint32_t id;
  const uint64_t num_elements;
  // Declared before the buffers, which it allocated and must outlive.
  const std::unique_ptr<Backend> backend;

  absl::Mutex mu;
  // Signalled whenever `version` advances, and on shutdown.
  absl::CondVar version_changed;

  uint64_t version ABSL_GUARDED_BY(mu) = 0;
  DeviceBuffer values ABSL_GUARDED_BY(mu);
  // Optimizer state: momentum velocity, Adam first moment or AdaGrad
  // accumulator (state_a); Adam second moment (state_b).
  DeviceBuffer state_a ABSL_GUARDED_BY(mu);
  DeviceBuffer state_b ABSL_GUARDED_BY(mu);

  // Sync: the sum of step `version`'s gradients and who contributed (by
  // rank), and who contributed to step `version - 1`.
  DeviceBuffer sum ABSL_GUARDED_BY(mu);
  std::vector<bool> contributed ABSL_GUARDED_BY(mu);
  std::vector<bool> contributed_previous ABSL_GUARDED_BY(mu);
  uint32_t num_contributors ABSL_GUARDED_BY(mu) = 0;

  // Async: per rank, the newest push applied.
  std::vector<AppliedMark> last_applied ABSL_GUARDED_BY(mu);

  ChunkCounters counters ABSL_GUARDED_BY(mu);
};

// Holds the mutexes of a push's chunks, taken in ascending chunk id order so
// that two multi-chunk pushes never deadlock. The chunks must be distinct.
class ShardStore::ChunkLocks {
 public:
  explicit ChunkLocks(std::vector<Chunk*> chunks) : chunks_(std::move(chunks)) {
    std::sort(chunks_.begin(), chunks_.end(),
              [](const Chunk* a, const Chunk* b) { return a->id < b->id; });
    for (Chunk* c : chunks_) c->mu.Lock();
  }
  ~ChunkLocks() {
    for (auto it = chunks_.rbegin(); it != chunks_.rend(); ++it)
      (*it)->mu.Unlock();
  }
  ChunkLocks(const ChunkLocks&) = delete;
  ChunkLocks& operator=(const ChunkLocks&) = delete;

 private:
  std::vector<Chunk*> chunks_;
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
  std::unique_ptr<ShardStore> store(new ShardStore(std::move(options)));
  if (absl::Status s = store->Initialize(); !s.ok()) return s;
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
      sync_(config_.mode() == v1::MODE_SYNC) {
  absl::MutexLock lock(&members_mu_);
  live_.assign(num_workers_, true);
  incarnation_of_.assign(num_workers_, 0);
}

ShardStore::~ShardStore() = default;

absl::Status ShardStore::Initialize() {
  const v1::OptimizerKind kind = config_.optimizer().kind();
  const bool needs_a = kind == v1::OPTIMIZER_MOMENTUM ||
                       kind == v1::OPTIMIZER_NESTEROV ||
                       kind == v1::OPTIMIZER_ADAM ||
                       kind == v1::OPTIMIZER_ADAGRAD;
  const bool needs_b = kind == v1::OPTIMIZER_ADAM;
  local_index_.assign(map_.chunks_size(), -1);
  for (const v1::ChunkSpec& spec : map_.chunks()) {
    if (spec.shard() != shard_) continue;
    std::unique_ptr<Backend> backend = make_backend_();
    if (backend == nullptr || backend->IsCuda())
      return absl::InvalidArgumentError(
          "the shard store needs a host-memory backend for its chunks");
    auto chunk = std::make_unique<Chunk>(spec.chunk_id(), spec.num_elements(),
                                         std::move(backend));
    Chunk& c = *chunk;
    absl::MutexLock lock(&c.mu);
    const size_t n = c.num_elements;
    const size_t bytes = n * sizeof(float);
    Backend* b = c.backend.get();
    c.values = DeviceBuffer(b, bytes);
    if (absl::Status s = InitializeRange(
            map_.tensors(spec.tensor_index()), config_.seed(),
            spec.tensor_index(), spec.offset(), n, c.values.f32());
        !s.ok())
      return absl::InvalidArgumentError(absl::StrCat(
          "chunk ", spec.chunk_id(), ": ", s.message()));
    if (needs_a) {
      c.state_a = DeviceBuffer(b, bytes);
      b->Fill(c.state_a.f32(), 0.0f, n);
    }
    if (needs_b) {
      c.state_b = DeviceBuffer(b, bytes);
      b->Fill(c.state_b.f32(), 0.0f, n);
    }
    if (sync_) {
      c.sum = DeviceBuffer(b, bytes);
      b->Fill(c.sum.f32(), 0.0f, n);
      c.contributed.assign(num_workers_, false);
      c.contributed_previous.assign(num_workers_, false);
    } else {
      c.last_applied.assign(num_workers_, AppliedMark{});
    }
    local_index_[spec.chunk_id()] = static_cast<int>(chunks_.size());
    chunk_ids_.push_back(spec.chunk_id());
    chunks_.push_back(std::move(chunk));
  }
  return absl::OkStatus();
}

ShardStore::Chunk* ShardStore::FindChunk(uint32_t chunk_id) const {
  if (chunk_id >= local_index_.size() || local_index_[chunk_id] < 0)
    return nullptr;
  return chunks_[local_index_[chunk_id]].get();
}

absl::Status ShardStore::AdmitIncarnation(uint32_t rank,
                                          uint64_t incarnation) {
  absl::MutexLock lock(&members_mu_);
  uint64_t& known = incarnation_of_[rank];
  if (incarnation < known)
    return absl::FailedPreconditionError(absl::StrCat(
        "stale incarnation: worker ", rank, " pushed as incarnation ",
        incarnation, " but incarnation ", known, " is current"));
  known = incarnation;
  return absl::OkStatus();
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
    if (g.values.size() != c->num_elements)
      return absl::InvalidArgumentError(absl::StrCat(
          "chunk ", g.chunk_id, ": ", g.values.size(),
          " gradient values for ", c->num_elements, " elements"));
    chunks.push_back(c);
  }
  std::vector<Chunk*> sorted = chunks;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())
    return absl::InvalidArgumentError("a chunk appears twice in one push");

  if (absl::Status s = AdmitIncarnation(push.worker_rank, push.incarnation);
      !s.ok()) {
    rejected_.fetch_add(push.chunks.size());
    return s;
  }
  absl::StatusOr<PushResult> result =
      sync_ ? PushSync(push, chunks) : PushAsync(push, chunks);
  if (!result.ok()) rejected_.fetch_add(push.chunks.size());
  return result;
}

absl::StatusOr<ShardStore::PushResult> ShardStore::PushSync(
    const GradientPush& push, const std::vector<Chunk*>& chunks) {
  const uint32_t rank = push.worker_rank;
  const uint64_t step = push.step;
  ChunkLocks locks(chunks);
  // Decide every chunk before changing any.
  std::vector<bool> duplicate(chunks.size(), false);
  for (size_t i = 0; i < chunks.size(); ++i) {
    Chunk& c = *chunks[i];
    c.mu.AssertHeld();
    if (step == c.version) {
      duplicate[i] = c.contributed[rank];
    } else if (step > c.version) {
      return absl::FailedPreconditionError(absl::StrCat(
          "push for step ", step, " but chunk ", c.id, " is at step ",
          c.version));
    } else if (step + 1 == c.version && c.contributed_previous[rank]) {
      duplicate[i] = true;
    } else {
      return absl::FailedPreconditionError(absl::StrCat(
          "late gradient: push for step ", step, " but chunk ", c.id,
          " is already at step ", c.version, " (the step completed without "
          "worker ", rank, ")"));
    }
  }
  PushResult result;
  result.versions.reserve(chunks.size());
  for (size_t i = 0; i < chunks.size(); ++i) {
    Chunk& c = *chunks[i];
    c.mu.AssertHeld();
    const ChunkGradient& g = push.chunks[i];
    ++c.counters.pushes;
    c.counters.bytes_in += g.wire_bytes;
    result.versions.push_back(step + 1);
    if (duplicate[i]) {
      ++c.counters.duplicates;
      ++result.duplicates;
      continue;
    }
    c.backend->Axpy(1.0f, g.values.data(), c.sum.f32(), c.num_elements);
    c.contributed[rank] = true;
    ++c.num_contributors;
    MaybeCompleteSyncStep(c);
  }
  return result;
}

void ShardStore::MaybeCompleteSyncStep(Chunk& c) {
  c.mu.AssertHeld();
  if (c.num_contributors == 0) return;
  {
    absl::ReaderMutexLock lock(&members_mu_);
    for (uint32_t r = 0; r < num_workers_; ++r)
      if (live_[r] && !c.contributed[r]) return;
  }
  float* grad = c.sum.f32();
  c.backend->Scale(1.0f / static_cast<float>(c.num_contributors), grad,
                   c.num_elements);
  ApplyUpdate(c, grad, ScheduledLearningRate(config_.optimizer(), c.version));
  c.backend->Fill(grad, 0.0f, c.num_elements);
  c.contributed_previous.swap(c.contributed);
  c.contributed.assign(num_workers_, false);
  c.num_contributors = 0;
}

absl::StatusOr<ShardStore::PushResult> ShardStore::PushAsync(
    const GradientPush& push, const std::vector<Chunk*>& chunks) {
  const uint32_t rank = push.worker_rank;
  const uint32_t max_staleness = config_.max_staleness();
  ChunkLocks locks(chunks);
  std::vector<bool> duplicate(chunks.size(), false);
  for (size_t i = 0; i < chunks.size(); ++i) {
    Chunk& c = *chunks[i];
    c.mu.AssertHeld();
    const AppliedMark& mark = c.last_applied[rank];
    const uint64_t base = push.chunks[i].base_version;
    if (mark.valid && mark.incarnation > push.incarnation)
      return absl::FailedPreconditionError(absl::StrCat(
          "stale incarnation: worker ", rank, " pushed as incarnation ",
          push.incarnation, " but incarnation ", mark.incarnation,
          " already updated chunk ", c.id));
    if (mark.valid && mark.incarnation == push.incarnation &&
        push.step <= mark.step) {
      duplicate[i] = true;
    } else if (base > c.version) {
      return absl::FailedPreconditionError(absl::StrCat(
          "gradient for chunk ", c.id, " was computed on version ", base,
          " but the chunk is only at version ", c.version));
    } else if (max_staleness > 0 && c.version - base > max_staleness) {
      return absl::FailedPreconditionError(absl::StrCat(
          "gradient too stale: chunk ", c.id, " is at version ", c.version,
          ", the gradient was computed on version ", base, " (staleness ",
          c.version - base, " > max_staleness ", max_staleness, ")"));
    }
  }
  PushResult result;
  result.versions.reserve(chunks.size());
  for (size_t i = 0; i < chunks.size(); ++i) {
    Chunk& c = *chunks[i];
    c.mu.AssertHeld();
    const ChunkGradient& g = push.chunks[i];
    ++c.counters.pushes;
    c.counters.bytes_in += g.wire_bytes;
    if (duplicate[i]) {
      ++c.counters.duplicates;
      ++result.duplicates;
      result.versions.push_back(c.version);
      continue;
    }
    const uint64_t staleness = c.version - g.base_version;
    const float lr = AsyncLearningRate(config_, c.version, staleness);
    ApplyUpdate(c, g.values.data(), lr);
    ChunkCounters& k = c.counters;
    ++k.staleness_count;
    k.staleness_sum += staleness;
    k.staleness_max = std::max(k.staleness_max, staleness);
    ++k.staleness_histogram[std::min<uint64_t>(staleness,
                                               kStalenessBuckets - 1)];
    c.last_applied[rank] = AppliedMark{true, push.incarnation, push.step};
    result.versions.push_back(c.version);
  }
  return result;
}

void ShardStore::ApplyUpdate(Chunk& c, const float* grad, float lr) {
  c.mu.AssertHeld();
  const v1::OptimizerConfig& opt = config_.optimizer();
  float* param = c.values.f32();
  const size_t n = c.num_elements;
  switch (opt.kind()) {
    case v1::OPTIMIZER_MOMENTUM:
    case v1::OPTIMIZER_NESTEROV: {
      MomentumParams p;
      p.lr = lr;
      p.momentum = opt.momentum();
      p.nesterov = opt.kind() == v1::OPTIMIZER_NESTEROV;
      p.weight_decay = opt.weight_decay();
      c.backend->MomentumUpdate(p, param, grad, c.state_a.f32(), n);
      break;
    }
    case v1::OPTIMIZER_ADAM: {
      AdamParams p;
      p.lr = lr;
      p.beta1 = opt.beta1();
      p.beta2 = opt.beta2();
      p.epsilon = opt.epsilon();
      p.weight_decay = opt.weight_decay();
      p.step = static_cast<int64_t>(c.version + 1);
      c.backend->AdamUpdate(p, param, grad, c.state_a.f32(), c.state_b.f32(),
                            n);
      break;
    }
    case v1::OPTIMIZER_ADAGRAD: {
      AdagradParams p;
      p.lr = lr;
      p.epsilon = opt.epsilon();
      p.weight_decay = opt.weight_decay();
      c.backend->AdagradUpdate(p, param, grad, c.state_a.f32(), n);
      break;
    }
    default: {  // OPTIMIZER_SGD; ValidateJobConfig admits nothing else.
      SgdParams p;
      p.lr = lr;
      p.weight_decay = opt.weight_decay();
      c.backend->SgdUpdate(p, param, grad, n);
      break;
    }
  }
  ++c.version;
  ++c.counters.updates;
  c.version_changed.SignalAll();
}

absl::StatusOr<std::vector<ShardStore::PulledChunk>> ShardStore::Pull(
    absl::Span<const uint32_t> chunk_ids, uint64_t min_version,
    absl::Time deadline, DType dtype) {
  if (shutdown_.load())
    return absl::UnavailableError("shard is shutting down");
  if (chunk_ids.empty()) chunk_ids = chunk_ids_;
  std::vector<Chunk*> chunks;
  chunks.reserve(chunk_ids.size());
  for (uint32_t id : chunk_ids) {
    Chunk* c = FindChunk(id);
    if (c == nullptr)
      return absl::NotFoundError(
          absl::StrCat("chunk ", id, " is not held by shard ", shard_));
    chunks.push_back(c);
  }
  // First wait for every chunk (one lock at a time, none held while
  // waiting), then copy: versions only grow, so the copies all satisfy
  // min_version, and a pull that fails has served and counted nothing.
  const absl::Time start = absl::Now();
  for (Chunk* c : chunks) {
    absl::MutexLock lock(&c->mu);
    while (c->version < min_version) {
      if (shutdown_.load())
        return absl::UnavailableError("shard is shutting down");
      const bool timed_out =
          c->version_changed.WaitWithDeadline(&c->mu, deadline);
      if (timed_out && c->version < min_version)
        return absl::DeadlineExceededError(absl::StrCat(
            "chunk ", c->id, " is at version ", c->version, ", wanted >= ",
            min_version, " (waited ",
            absl::ToInt64Milliseconds(absl::Now() - start), " ms)"));
    }
  }
  std::vector<PulledChunk> out(chunks.size());
  for (size_t i = 0; i < chunks.size(); ++i) {
    Chunk& c = *chunks[i];
    PulledChunk& p = out[i];
    p.chunk_id = c.id;
    p.data.resize(c.num_elements * DTypeSize(dtype));
    absl::MutexLock lock(&c.mu);
    p.version = c.version;
    ConvertElements(c.values.f32(), DType::kF32, p.data.data(), dtype,
                    c.num_elements);
    ++c.counters.pulls;
    c.counters.bytes_out += p.data.size();
  }
  return out;
}

absl::StatusOr<ShardStore::ChunkValues> ShardStore::ReadChunk(
    uint32_t chunk_id) const {
  Chunk* c = FindChunk(chunk_id);
  if (c == nullptr)
    return absl::NotFoundError(
        absl::StrCat("chunk ", chunk_id, " is not held by shard ", shard_));
  absl::MutexLock lock(&c->mu);
  ChunkValues out;
  out.version = c->version;
  out.values.assign(c->values.f32(), c->values.f32() + c->num_elements);
  return out;
}

void ShardStore::SetLiveWorkers(absl::Span<const uint32_t> ranks,
                                absl::Span<const uint64_t> incarnations) {
  {
    absl::MutexLock lock(&members_mu_);
    live_.assign(num_workers_, false);
    for (size_t i = 0; i < ranks.size(); ++i) {
      const uint32_t r = ranks[i];
      if (r >= num_workers_) continue;
      live_[r] = true;
      if (i < incarnations.size())
        incarnation_of_[r] = std::max(incarnation_of_[r], incarnations[i]);
    }
  }
  if (!sync_) return;
  for (const std::unique_ptr<Chunk>& chunk : chunks_) {
    absl::MutexLock lock(&chunk->mu);
    MaybeCompleteSyncStep(*chunk);
  }
}

void ShardStore::CountRejectedAtEdge(uint64_t chunk_gradients) {
  rejected_.fetch_add(chunk_gradients);
}

v1::ShardStatus ShardStore::Status() const {
  v1::ShardStatus s;
  s.set_shard(shard_);
  s.set_address(address_);
  s.set_incarnation(incarnation_);
  s.set_num_chunks(chunks_.size());
  ChunkCounters total;
  uint64_t elements = 0;
  uint64_t min_version = chunks_.empty() ? 0 : std::numeric_limits<uint64_t>::max();
  for (const std::unique_ptr<Chunk>& chunk : chunks_) {
    Chunk& c = *chunk;
    absl::MutexLock lock(&c.mu);
    elements += c.num_elements;
    min_version = std::min(min_version, c.version);
    total.Add(c.counters);
  }
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
  return s;
}

void ShardStore::Shutdown() {
  shutdown_.store(true);
  // Taking each chunk's mutex orders the flag before any waiter's next check.
  for (const std::unique_ptr<Chunk>& c : chunks_) {
    absl::MutexLock lock(&c->mu);
    c->version_changed.SignalAll();
  }
}

}  // namespace grps
