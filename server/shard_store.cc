#include "server/shard_store.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "job/initializer.h"
#include "job/job_config.h"
#include "job/shard_map.h"
#include "wire/buffer_pool.h"

namespace grps {

// A pull waiting for its targets: the wait is shared, the reading and the
// answer are the kind's own (dense chunks or sparse rows).
struct ShardStore::Waiter : WaitingPull {
  // With target i's lock held, every target ready: reads it into the
  // answer. An error fails the pull (nothing is served).
  virtual absl::Status ReadLocked(size_t i, StoreTarget& t) = 0;
  absl::Time deadline() const override { return wait->deadline; }

  const PullWait* wait = nullptr;  // points into the subclass's spec
  std::vector<StoreTarget*> targets;
};

struct ShardStore::DenseWaiter final : Waiter {
  absl::Status ReadLocked(size_t i, StoreTarget& t) override {
    StoreChunk& c = static_cast<StoreChunk&>(t);
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
  absl::Status ReadLocked(size_t, StoreTarget& t) override {
    StoreTable& table = static_cast<StoreTable&>(t);
    table.mu.AssertHeld();
    if (absl::Status s = table.rows->CheckRoom(spec.ids); !s.ok()) return s;
    const size_t n = spec.ids.size() * table.spec.dim();
    pulled.version = table.version();
    pulled.data = std::move(spec.reply);
    pulled.data.resize(n * DTypeSize(spec.dtype));
    if (spec.dtype == DType::kF32) {  // read into the reply's bytes (aligned as any string's)
      table.rows->Read(spec.ids, reinterpret_cast<float*>(pulled.data.data()));
    } else {
      thread_local std::vector<float> rows;
      rows.resize(n);
      table.rows->Read(spec.ids, rows.data());
      ConvertElements(rows.data(), DType::kF32, pulled.data.data(), spec.dtype, n);
    }
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
  return store;
}

ShardStore::ShardStore(Options options)
    : config_(std::move(options.config)),
      map_(std::move(options.shard_map)),
      shard_(options.shard),
      incarnation_(options.incarnation),
      address_(std::move(options.address)),
      make_backend_(std::move(options.make_backend)),
      num_workers_(JobRanks(config_)),
      admission_(num_workers_, config_.num_workers()),
      pulls_(options.max_waiting_pulls > 0 ? options.max_waiting_pulls
                                           : MaxWaitingPulls(config_, map_, shard_, num_workers_),
             absl::StrCat("shard ", shard_), [this](WaitingPull& w) { return TryServe(w); }) {}

size_t ShardStore::MaxWaitingPulls(const v1::JobConfig& config, const v1::ShardMap& map,
                                   uint32_t shard, uint32_t workers) {
  size_t chunks = 0;
  for (const v1::ChunkSpec& spec : map.chunks()) chunks += spec.shard() == shard ? 1 : 0;
  const size_t per_worker = std::max(
      kWaitingPullsPerWorker, 2 * chunks + 4 * static_cast<size_t>(config.sparse_tables_size()));
  return per_worker * std::max(1u, workers);
}

ShardStore::~ShardStore() {
  Shutdown();
  pulls_.Stop();
}

absl::Status ShardStore::Initialize() {
  local_index_.assign(map_.chunks_size(), -1);
  for (const v1::ChunkSpec& spec : map_.chunks()) {
    if (spec.shard() != shard_) continue;
    std::unique_ptr<Backend> backend = make_backend_();
    if (backend == nullptr || backend->IsCuda())
      return absl::InvalidArgumentError(
          "the shard store needs a host-memory backend for its chunks");
    auto chunk = std::make_unique<StoreChunk>(spec.chunk_id(), spec.num_elements(),
                                         std::move(backend), config_);
    {
      absl::MutexLock lock(&chunk->mu);
      const v1::TensorSpec& tensor = map_.tensors(spec.tensor_index());
      if (absl::Status s = InitializeRange(tensor, config_.seed(), spec.tensor_index(),
                                           spec.offset(), spec.num_elements(),
                                           chunk->values.f32());
          !s.ok())
        return absl::InvalidArgumentError(
            absl::StrCat("chunk ", spec.chunk_id(), ": ", s.message()));
      chunk->awaiting_values = tensor.initializer() == "given";
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
    tables_.push_back(std::make_unique<StoreTable>(i, config_.sparse_tables(i), std::move(backend),
                                              config_));
  }
  std::vector<StoreTarget*> targets = AllTargets();
  capture_ = std::make_unique<CheckpointCapture>(CheckpointCapture::Shard{
      config_.job_id(), shard_, std::move(targets), &generation_, &shutdown_});
  return absl::OkStatus();
}

StoreTable* ShardStore::FindTable(std::string_view name) const {
  for (const std::unique_ptr<StoreTable>& t : tables_)
    if (t->spec.name() == name) return t.get();
  return nullptr;
}

std::vector<StoreTarget*> ShardStore::AllTargets() const {
  std::vector<StoreTarget*> all;
  all.reserve(chunks_.size() + tables_.size());
  for (const std::unique_ptr<StoreChunk>& c : chunks_) all.push_back(c.get());
  for (const std::unique_ptr<StoreTable>& t : tables_) all.push_back(t.get());
  return all;
}

StoreChunk* ShardStore::FindChunk(uint32_t chunk_id) const {
  if (chunk_id >= local_index_.size() || local_index_[chunk_id] < 0) return nullptr;
  return chunks_[local_index_[chunk_id]].get();
}

// ---- A push's admission: the store's one pass (its order: shard_store.h) ----

absl::Status ShardStore::CheckWorker(uint32_t rank) const {
  if (shutdown_.load()) return absl::UnavailableError("shard is shutting down");
  if (rank >= num_workers_)
    return absl::InvalidArgumentError(absl::StrCat("unknown worker rank ", rank));
  return absl::OkStatus();
}

template <typename Request>
absl::Status ShardStore::Admit(const PushAdmission::Pusher& pusher, uint64_t generation,
                               const Request& request, Admitting what, Admitted* out) {
  if (absl::Status s = CheckWorker(pusher.rank); !s.ok()) return s;  // 1, 2
  absl::StatusOr<std::vector<PushAdmission::TargetGradient>> grads = TargetsOf(request);  // 3
  if (!grads.ok()) return grads.status();
  std::vector<StoreTarget*> targets;
  targets.reserve(grads->size());
  for (const PushAdmission::TargetGradient& g : *grads) targets.push_back(g.target);
  std::vector<StoreTarget*> sorted = targets;  // 4
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())
    return absl::InvalidArgumentError("a chunk appears twice in one push");
  out->grads = std::move(*grads);
  out->locks.emplace(targets);
  return CheckLocked(pusher, generation, what, out);  // 5 to 8
}

absl::StatusOr<std::vector<PushAdmission::TargetGradient>> ShardStore::TargetsOf(
    const GradientPush& push) const {
  std::vector<PushAdmission::TargetGradient> grads;
  grads.reserve(push.chunks.size());
  for (const ChunkGradient& g : push.chunks) {
    StoreChunk* c = FindChunk(g.chunk_id);
    if (c == nullptr)
      return absl::NotFoundError(
          absl::StrCat("chunk ", g.chunk_id, " is not held by shard ", shard_));
    if (g.values.size() != c->num_elements())
      return absl::InvalidArgumentError(absl::StrCat("chunk ", g.chunk_id, ": ", g.values.size(),
                                                     " gradient values for ", c->num_elements(),
                                                     " elements"));
    grads.push_back({c, GradientRef{g.values, {}}, g.base_version, g.wire_bytes, g.optimizer});
  }
  return grads;
}

absl::StatusOr<std::vector<PushAdmission::TargetGradient>> ShardStore::TargetsOf(
    const SparseGradientPush& push) const {
  StoreTable* table = FindTable(push.table);
  if (table == nullptr)
    return absl::NotFoundError(absl::StrCat("the job has no sparse table '", push.table, "'"));
  if (push.values.size() != push.ids.size() * table->spec.dim())
    return absl::InvalidArgumentError(absl::StrCat(
        table->name, ": ", push.values.size(), " gradient values for ", push.ids.size(),
        " rows of ", table->spec.dim()));
  return std::vector<PushAdmission::TargetGradient>{
      {table, GradientRef{push.values, push.ids}, push.base_version, push.wire_bytes}};
}

absl::StatusOr<std::vector<PushAdmission::TargetGradient>> ShardStore::TargetsOf(
    const v1::LoadOptimizerStateRequest& request) const {
  std::vector<PushAdmission::TargetGradient> targets;  // no gradients: a state
  for (const v1::ChunkOptimizerState& state : request.chunks()) {
    StoreChunk* c = FindChunk(state.chunk_id());
    if (c == nullptr)
      return absl::NotFoundError(
          absl::StrCat("chunk ", state.chunk_id(), " is not held by shard ", shard_));
    targets.emplace_back().target = c;
  }
  return targets;
}

absl::Status ShardStore::CheckLocked(const PushAdmission::Pusher& pusher, uint64_t generation,
                                     Admitting what, Admitted* out) {
  if (absl::Status s = admission_.CheckIncarnation(pusher, out->grads.size()); !s.ok())
    return s;  // 5
  if (what == Admitting::kChunkGradients)  // 6
    for (const PushAdmission::TargetGradient& g : out->grads)
      if (g.target->awaiting_values)
        return absl::UnavailableError(absl::StrCat(
            g.target->name, " has no values yet: worker rank 0 gives them (broadcast_parameters)"));
  if (absl::Status s = CheckGeneration(generation); !s.ok()) return s;  // 7
  return DecideLocked(pusher, what, out);  // 8
}

absl::Status ShardStore::DecideLocked(const PushAdmission::Pusher& pusher, Admitting what,
                                      Admitted* out) {
  switch (what) {
    case Admitting::kChunkGradients:
      return admission_.Decide(pusher, out->grads, &out->duplicate);
    case Admitting::kRowGradients: {
      if (absl::Status s = admission_.Decide(pusher, out->grads, &out->duplicate); !s.ok())
        return s;
      if (out->duplicate[0]) return absl::OkStatus();
      // The rows' limit is decided before the push is taken: all or
      // nothing. Nothing after CheckRoom refuses the push; PushSparse makes
      // the rows (TakePush) before it is accepted.
      StoreTable& table = static_cast<StoreTable&>(*out->grads[0].target);
      if (absl::Status s = table.rows->CheckRoom(out->grads[0].grad.ids); !s.ok()) {
        admission_.CountRejected(1);
        return s;
      }
      return absl::OkStatus();
    }
    case Admitting::kInitialValues:
      for (const PushAdmission::TargetGradient& g : out->grads) {
        const absl::Span<const float> values = g.grad.values;
        if (FirstNonFinite(values.data(), static_cast<int64_t>(values.size())) >= 0)
          return absl::InvalidArgumentError(
              absl::StrCat(g.target->name, ": an initial value is not a finite number"));
      }
      return absl::OkStatus();
    case Admitting::kOptimizerState:
      for (const PushAdmission::TargetGradient& g : out->grads)
        if (g.target->version() > 0)
          return absl::FailedPreconditionError(absl::StrCat(
              g.target->name, " has had ", g.target->version(),
              " updates: a saved optimizer state starts a job, before its first update"));
      return absl::OkStatus();
  }
  return absl::OkStatus();
}

// ---- Pushes: admitted (above), then taken ----

absl::StatusOr<ShardStore::PushResult> ShardStore::Push(const GradientPush& push) {
  const PushAdmission::Pusher pusher{push.worker_rank, push.incarnation, push.step};
  PushResult result;
  {
    Admitted admitted;
    if (absl::Status s =
            Admit(pusher, push.generation, push, Admitting::kChunkGradients, &admitted);
        !s.ok())
      return s;
    for (const PushAdmission::Outcome& o :
         admission_.Accept(pusher, admitted.grads, admitted.duplicate, *admission_.live())) {
      result.versions.push_back(o.version);
      result.duplicates += o.duplicate;
      result.late += o.late;
      result.too_stale += o.too_stale;
    }
  }
  admission_.RaiseIncarnation(pusher);
  pulls_.Wake();
  return result;
}

absl::StatusOr<ShardStore::SparsePushResult> ShardStore::PushSparse(
    const SparseGradientPush& push) {
  const PushAdmission::Pusher pusher{push.worker_rank, push.incarnation, push.step};
  PushAdmission::Outcome outcome;
  {
    Admitted admitted;
    if (absl::Status s =
            Admit(pusher, push.generation, push, Admitting::kRowGradients, &admitted);
        !s.ok())
      return s;
    StoreTable* table = nullptr;
    if (!admitted.duplicate[0]) {
      table = static_cast<StoreTable*>(admitted.grads[0].target);
      table->mu.AssertHeld();
      table->rows_pushed += push.ids.size();
      // Async applies a push as it is taken (or refuses it as too stale,
      // applying nothing else): Update counts its rows in the walk that
      // updates them. Sync and ssp may apply other gradients first: the push
      // is taken before.
      if (config_.mode() == v1::MODE_ASYNC && !push.ids.empty()) {
        table->accepting_ids = push.ids.data();
        table->push_applied = false;
      } else {
        table->rows->TakePush(push.ids);
      }
    }
    outcome = admission_.Accept(pusher, admitted.grads, admitted.duplicate,
                                *admission_.live())[0];
    if (table != nullptr) {
      table->mu.AssertHeld();
      if (table->accepting_ids != nullptr && !table->push_applied)
        table->rows->TakePush(push.ids);  // too stale: taken, not applied
      table->accepting_ids = nullptr;
    }
  }
  admission_.RaiseIncarnation(pusher);
  pulls_.Wake();
  return SparsePushResult{outcome.version, outcome.duplicate, outcome.late, outcome.too_stale};
}

absl::StatusOr<uint32_t> ShardStore::GiveInitialValues(const GradientPush& push) {
  if (push.worker_rank != 0)
    return absl::PermissionDeniedError(absl::StrCat(
        "initial values come from worker rank 0, not rank ", push.worker_rank));
  const PushAdmission::Pusher pusher{push.worker_rank, push.incarnation, push.step};
  uint32_t taken = 0;
  {
    Admitted admitted;
    if (absl::Status s =
            Admit(pusher, push.generation, push, Admitting::kInitialValues, &admitted);
        !s.ok())
      return s;
    taken = GiveLocked(admitted);
  }
  pulls_.Wake();
  return taken;
}

uint32_t ShardStore::GiveLocked(const Admitted& admitted) {
  uint32_t taken = 0;
  for (const PushAdmission::TargetGradient& g : admitted.grads)
    taken += static_cast<StoreChunk*>(g.target)->Give(g.grad.values);
  return taken;
}

absl::Status ShardStore::LoadOptimizerState(const v1::LoadOptimizerStateRequest& request) {
  const PushAdmission::Pusher pusher{request.worker_rank(), request.incarnation(), 0};
  Admitted admitted;
  if (absl::Status s = Admit(pusher, request.generation(), request,
                             Admitting::kOptimizerState, &admitted);
      !s.ok())
    return s;
  LoadOptimizerStateLocked(admitted, request);
  return absl::OkStatus();
}

void ShardStore::LoadOptimizerStateLocked(const Admitted& admitted,
                                          const v1::LoadOptimizerStateRequest& request) {
  for (size_t i = 0; i < admitted.grads.size(); ++i) {
    const v1::ChunkOptimizerState& state = request.chunks(static_cast<int>(i));
    std::vector<const std::string*> slots;
    for (const std::string& slot : state.slots()) slots.push_back(&slot);
    static_cast<StoreChunk*>(admitted.grads[i].target)->LoadOptimizerState(slots, state.steps());
  }
}

absl::StatusOr<v1::GetOptimizerStateResponse> ShardStore::ReadOptimizerState(
    uint64_t generation, absl::Span<const uint32_t> chunk_ids) const {
  if (shutdown_.load()) return absl::UnavailableError("shard is shutting down");
  v1::GetOptimizerStateResponse out;
  out.set_kind(config_.optimizer().kind());
  for (uint32_t id : chunk_ids) {
    StoreChunk* c = FindChunk(id);
    if (c == nullptr)
      return absl::NotFoundError(absl::StrCat("chunk ", id, " is not held by shard ", shard_));
    absl::MutexLock lock(&c->mu);
    if (absl::Status s = CheckGeneration(generation); !s.ok()) return s;
    v1::ChunkOptimizerState* state = out.add_chunks();
    state->set_chunk_id(id);
    state->set_steps(c->OptimizerSteps());
    for (std::string& slot : c->optimizer->SaveState()) state->add_slots(std::move(slot));
  }
  return out;
}

// ---- Pulls ----

void ShardStore::PullAsync(PullSpec spec, PullCallback done) {
  if (absl::Status s = CheckWorker(spec.worker_rank); !s.ok()) {
    done(s);
    return;
  }
  auto w = std::make_unique<DenseWaiter>();
  if (spec.chunk_ids.empty()) spec.chunk_ids = chunk_ids_;
  for (uint32_t id : spec.chunk_ids) {
    StoreChunk* c = FindChunk(id);
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
  pulls_.Add(std::move(w));
}

void ShardStore::PullSparseAsync(SparsePullSpec spec, SparsePullCallback done) {
  if (absl::Status s = CheckWorker(spec.worker_rank); !s.ok()) {
    done(s);
    return;
  }
  StoreTable* table = FindTable(spec.table);
  if (table == nullptr) {
    done(absl::NotFoundError(absl::StrCat("the job has no sparse table '", spec.table, "'")));
    return;
  }
  auto w = std::make_unique<SparseWaiter>();
  w->targets.push_back(table);
  w->spec = std::move(spec);
  w->wait = &w->spec;
  w->done = std::move(done);
  pulls_.Add(std::move(w));
}

StoreTarget* ShardStore::Blocking(const Waiter& w, const LiveSet& live,
                                  uint64_t* version) const {
  const PullWait& spec = *w.wait;
  for (StoreTarget* t : w.targets) {
    absl::MutexLock lock(&t->mu);
    const bool ready = !t->awaiting_values && t->version() >= spec.min_version &&
                       (!spec.clock.has_value() ||
                        t->policy->ReadyToServe(spec.worker_rank, *spec.clock, *t, live));
    if (!ready) {
      *version = t->version();
      return t;
    }
  }
  return nullptr;
}

bool ShardStore::TryServe(WaitingPull& pull) {
  Waiter& w = static_cast<Waiter&>(pull);
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
  const std::shared_ptr<const LiveSet> live = admission_.live();
  // First check every target (one lock at a time), then read: readiness
  // only grows while the puller waits, so a pull that fails serves nothing.
  uint64_t version = 0;
  if (StoreTarget* blocking = Blocking(w, *live, &version); blocking != nullptr) {
    const absl::Time now = absl::Now();
    if (now < spec.deadline) return false;
    bool blocking_awaits = false;
    {
      absl::MutexLock lock(&blocking->mu);
      blocking_awaits = blocking->awaiting_values;
    }
    w.Fail(absl::DeadlineExceededError(absl::StrCat(
        blocking->name,
        blocking_awaits ? " has no values yet (worker rank 0 gives them)"
                        : absl::StrCat(" is at version ", version),
        spec.clock.has_value() ? absl::StrCat(", not yet readable at clock ", *spec.clock,
                                              " of worker ", spec.worker_rank)
                               : std::string(),
        spec.min_version > 0 ? absl::StrCat(", wanted >= ", spec.min_version) : std::string(),
        " (waited ", absl::ToInt64Milliseconds(now - w.start), " ms)")));
    return true;
  }
  bool applied = false;
  for (size_t i = 0; i < w.targets.size(); ++i) {
    StoreTarget& t = *w.targets[i];
    absl::MutexLock lock(&t.mu);
    if (absl::Status s = w.ReadLocked(i, t); !s.ok()) {
      w.Fail(s);
      break;
    }
    applied |= spec.clock.has_value()
                   ? t.policy->Served(spec.worker_rank, *spec.clock, t, *live)
                   : t.policy->ServedWithoutClock(spec.worker_rank, t, *live);
  }
  if (applied) pulls_.LookAgain();
  return true;
}

namespace {

// A blocking call's answer, handed over from the thread that answers it.
// Shared with the callback: Debian's Abseil (20220623) lets a waiter return
// from WaitForNotification while the notifying thread is still inside
// Notify() (unlocking the Notification's own mutex), so a Notification on
// the waiter's stack could be gone under it (ThreadSanitizer saw the
// notifier read the stack slot the waiter's next call had reused).
template <typename T>
struct Answer {
  absl::Notification answered;
  T value;
};

// Calls `start` with a callback and waits for that callback's value.
template <typename T, typename Start>
T AwaitAnswer(Start start) {
  auto answer = std::make_shared<Answer<T>>();
  start([answer](T value) {
    answer->value = std::move(value);
    answer->answered.Notify();
  });
  answer->answered.WaitForNotification();
  return std::move(answer->value);
}

}  // namespace

absl::StatusOr<ShardStore::PulledRows> ShardStore::PullSparse(SparsePullSpec spec) {
  return AwaitAnswer<absl::StatusOr<PulledRows>>([&](auto done) {
    PullSparseAsync(std::move(spec), std::move(done));
  });
}

absl::StatusOr<std::vector<ShardStore::PulledChunk>> ShardStore::Pull(
    PullSpec spec) {
  return AwaitAnswer<absl::StatusOr<std::vector<PulledChunk>>>([&](auto done) {
    PullAsync(std::move(spec), std::move(done));
  });
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

absl::StatusOr<ShardStore::ChunkValues> ShardStore::TEST_ReadChunk(
    uint32_t chunk_id) const {
  StoreChunk* c = FindChunk(chunk_id);
  if (c == nullptr)
    return absl::NotFoundError(
        absl::StrCat("chunk ", chunk_id, " is not held by shard ", shard_));
  absl::MutexLock lock(&c->mu);
  ChunkValues out;
  out.version = c->version();
  out.values.assign(c->values.f32(), c->values.f32() + c->num_elements());
  return out;
}

absl::StatusOr<std::vector<float>> ShardStore::TEST_ReadRow(const std::string& table,
                                                            int64_t id) const {
  StoreTable* t = FindTable(table);
  if (t == nullptr) return absl::NotFoundError(absl::StrCat("no table '", table, "'"));
  absl::MutexLock lock(&t->mu);
  const float* row = t->rows->TEST_Row(id);
  if (row == nullptr) return absl::NotFoundError(absl::StrCat("no row ", id));
  return std::vector<float>(row, row + t->spec.dim());
}

void ShardStore::SetLiveWorkers(absl::Span<const uint32_t> ranks,
                                absl::Span<const uint64_t> incarnations,
                                absl::Span<const uint64_t> counts_from) {
  const std::shared_ptr<const LiveSet> live =
      admission_.SetLiveWorkers(ranks, incarnations, counts_from);
  for (StoreTarget* t : AllTargets()) {
    absl::MutexLock lock(&t->mu);
    t->policy->LiveSetChanged(*t, *live);
  }
  pulls_.Wake();
}

// ---- Durability ----

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

absl::Status ShardStore::Restore(uint64_t generation, uint64_t checkpoint_id,
                                 const std::vector<v1::ChunkState>& states,
                                 absl::Span<const uint64_t> resume_steps,
                                 const std::vector<v1::TableState>& tables) {
  absl::StatusOr<std::vector<const v1::ChunkState*>> matched = MatchChunkStates(chunks_, states);
  if (!matched.ok()) return matched.status();
  absl::StatusOr<std::vector<LoadedTable>> loaded =
      LoadTableStates(tables_, shard_, config_.num_servers(), tables,
                      /*required=*/checkpoint_id > 0);
  if (!loaded.ok()) return loaded.status();
  {
    TargetLocks locks(AllTargets());
    if (generation_.load() > 0 && generation <= generation_.load())
      return absl::FailedPreconditionError(absl::StrCat(
          "generation ", generation, " is not newer than the shard's ", generation_.load()));
    if (absl::Status s = ResetTargets(chunks_, *matched, tables_, std::move(*loaded), map_,
                                      config_, resume_steps, *admission_.live());
        !s.ok())
      return s;
    generation_.store(generation);
    restored_checkpoint_.store(checkpoint_id);
  }
  pulls_.Wake();
  return absl::OkStatus();
}

absl::StatusOr<v1::ShardCheckpointFile> ShardStore::CaptureCheckpoint(
    const v1::CheckpointRequest& request, absl::Time deadline) {
  if (absl::Status s = ArmCheckpoint(request); !s.ok()) return s;
  return CollectCheckpoint(request.id(), deadline);
}

absl::Status ShardStore::ArmCheckpoint(const v1::CheckpointRequest& request,
                                       bool changes_only) {
  return capture_->Arm(request, changes_only);
}

absl::StatusOr<v1::ShardCheckpointFile> ShardStore::CollectCheckpoint(uint64_t id,
                                                                     absl::Time deadline) {
  return capture_->Collect(id, deadline);
}

void ShardStore::SetCheckpointReport(const v1::ShardCheckpoint& report) {
  absl::MutexLock lock(&report_mu_);
  report_ = report;
}

// ---- Status ----

void ShardStore::CountRejectedAtEdge(uint64_t chunk_gradients) {
  admission_.CountRejected(chunk_gradients);
}

v1::ShardStatus ShardStore::ShardStatus() const {
  v1::ShardStatus s;
  s.set_shard(shard_);
  s.set_address(address_);
  s.set_incarnation(incarnation_);
  AddTargetsStatus(chunks_, tables_, &s);
  s.set_rejected_pushes(admission_.rejected());
  s.set_generation(generation_.load());
  s.set_restored_checkpoint(restored_checkpoint_.load());
  {
    absl::MutexLock lock(&report_mu_);
    if (report_.id() > 0) *s.mutable_checkpoint() = report_;
  }
  s.set_waiting_pulls(pulls_.size());
  return s;
}

void ShardStore::Shutdown() {
  shutdown_.store(true);
  pulls_.Wake();
}

}  // namespace grps
