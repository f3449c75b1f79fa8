#include "server/store_targets.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "job/initializer.h"
#include "job/job_config.h"

namespace grps {
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

// ---- StoreTarget ----

StoreTarget::StoreTarget(uint64_t order, std::string name, const v1::JobConfig& config)
    : order(order), name(std::move(name)) {
  absl::MutexLock lock(&mu);
  policy = MakeChunkPolicy(config);
  marks.assign(JobRanks(config), AcceptedMark{});
  counters.late_by_worker.assign(JobRanks(config), 0);
}

void StoreTarget::Apply(const GradientRef& grad, const UpdateStep& step, int64_t staleness) {
  Update(grad, step);
  ++version_;
  ++counters.updates;
  if (capture_at != 0 && version_ == capture_at) {
    Capture();
    capture_at = 0;
  }
  if (staleness >= 0) counters.CountStaleness(static_cast<uint64_t>(staleness));
}

void StoreTarget::ResetEngine(const v1::JobConfig& config,
                              absl::Span<const uint64_t> resume_steps) {
  policy = MakeChunkPolicy(config);
  policy->Restored(resume_steps);
  marks.assign(marks.size(), AcceptedMark{});
  Disarm();
}

void StoreTarget::Capture() {
  captured.emplace();
  SnapshotInto(&*captured, capture_changes);
}

bool StoreTarget::TakeCapture(v1::ShardCheckpointFile* file) {
  if (!captured.has_value()) return false;
  for (v1::ChunkState& c : *captured->mutable_chunks()) *file->add_chunks() = std::move(c);
  for (v1::TableState& t : *captured->mutable_tables()) *file->add_tables() = std::move(t);
  captured.reset();
  return true;
}

void StoreTarget::Disarm() {
  capture_at = 0;
  captured.reset();
}

void StoreTarget::SnapshotMarks(google::protobuf::RepeatedPtrField<v1::DedupMark>* out,
                                google::protobuf::Map<uint32_t, uint64_t>* held_from) const {
  for (uint32_t rank = 0; rank < marks.size(); ++rank) {
    const AcceptedMark& m = marks[rank];
    v1::DedupMark* d = out->Add();
    d->set_valid(m.valid);
    d->set_incarnation(m.incarnation);
    d->set_step(m.step);
    if (const std::optional<uint64_t> from = policy->KeepMark(rank, *this, d); from.has_value())
      (*held_from)[rank] = *from;
  }
}

void StoreTarget::LoadMarks(const google::protobuf::RepeatedPtrField<v1::DedupMark>& saved) {
  for (int r = 0; r < saved.size() && r < static_cast<int>(marks.size()); ++r)
    marks[r] = AcceptedMark{saved[r].valid(), saved[r].incarnation(), saved[r].step()};
}

void StoreTarget::SnapshotCounters(v1::StateCounters* out) const {
  counters.SaveState(out);
  out->set_pushes(out->pushes() - std::min(policy->NotKept(*this), out->pushes()));
}

// ---- StoreChunk ----

StoreChunk::StoreChunk(uint32_t id, uint64_t num_elements, std::unique_ptr<Backend> backend,
                       const v1::JobConfig& config)
    : StoreTarget(id, absl::StrCat("chunk ", id), config),
      id(id),
      num_elements_(num_elements),
      backend_(std::move(backend)) {
  absl::MutexLock lock(&mu);
  values = DeviceBuffer(backend_.get(), num_elements_ * sizeof(float));
  optimizer = std::make_unique<ChunkOptimizer>(config.optimizer(), config.mode(), backend_.get(),
                                               num_elements_);
}

StoreChunk::~StoreChunk() {
  absl::MutexLock lock(&mu);
  policy.reset();
}

std::unique_ptr<GradientBuffer> StoreChunk::NewBuffer() {
  return std::make_unique<DenseGradientBuffer>(backend_.get(), num_elements_);
}

absl::Status StoreChunk::Reset(const v1::ChunkState* state, const v1::ChunkSpec& spec,
                               const v1::TensorSpec& tensor, const v1::JobConfig& config,
                               absl::Span<const uint64_t> resume_steps) {
  ResetEngine(config, resume_steps);
  if (state == nullptr) {
    version_ = 0;
    step_offset_ = 0;
    counters.LoadState(nullptr);
    optimizer->Reset();
    if (!given_.empty()) {
      std::memcpy(values.f32(), given_.data(), num_elements_ * sizeof(float));
      return absl::OkStatus();
    }
    awaiting_values = tensor.initializer() == "given";
    return InitializeRange(tensor, config.seed(), spec.tensor_index(), spec.offset(),
                           spec.num_elements(), values.f32());
  }
  awaiting_values = false;
  version_ = state->version();
  step_offset_ = state->optimizer_step_offset();
  counters.LoadState(state->has_counters() ? &state->counters() : nullptr);
  std::memcpy(values.f32(), state->values().data(), num_elements_ * sizeof(float));
  std::vector<const std::string*> slots;
  for (const std::string& slot : state->optimizer_state()) slots.push_back(&slot);
  optimizer->LoadState(slots);
  LoadMarks(state->marks());
  return absl::OkStatus();
}

bool StoreChunk::Give(absl::Span<const float> initial) {
  if (!awaiting_values || initial.size() != num_elements_) return false;
  std::memcpy(values.f32(), initial.data(), num_elements_ * sizeof(float));
  given_.assign(initial.begin(), initial.end());
  awaiting_values = false;
  return true;
}

void StoreChunk::LoadOptimizerState(const std::vector<const std::string*>& slots,
                                    uint64_t steps) {
  optimizer->LoadState(slots);
  step_offset_ = static_cast<int64_t>(steps) - static_cast<int64_t>(version_);
}

void StoreChunk::Update(const GradientRef& grad, const UpdateStep& step) {
  optimizer->Apply(values.f32(), grad.values.data(), step, OptimizerSteps());
}

void StoreChunk::SnapshotInto(v1::ShardCheckpointFile* into, bool /*changes_only*/) {
  v1::ChunkState* out = into->add_chunks();
  out->set_chunk_id(id);
  out->set_version(version_);
  out->set_num_elements(num_elements_);
  out->set_values(reinterpret_cast<const char*>(values.f32()), num_elements_ * sizeof(float));
  for (std::string& slot : optimizer->SaveState()) out->add_optimizer_state(std::move(slot));
  out->set_optimizer_step_offset(step_offset_);
  SnapshotMarks(out->mutable_marks(), out->mutable_held_from());
  SnapshotCounters(out->mutable_counters());
}

// ---- StoreTable ----

StoreTable::StoreTable(uint32_t index, const v1::SparseTableSpec& spec,
                       std::unique_ptr<Backend> backend, const v1::JobConfig& config)
    : StoreTarget((uint64_t{1} << 32) + index, absl::StrCat("table '", spec.name(), "'"), config),
      spec(spec),
      config_(config),
      backend_(std::move(backend)) {
  absl::MutexLock lock(&mu);
  rows = NewRows();
}

std::unique_ptr<SparseRows> StoreTable::NewRows() const {
  auto rows =
      std::make_unique<SparseRows>(spec, config_.optimizer(), config_.seed(), backend_.get());
  // Incremental checkpoints take the rows changed since the previous one.
  rows->set_track_changes(config_.checkpoint_full_every() > 0);
  return rows;
}

std::unique_ptr<GradientBuffer> StoreTable::NewBuffer() { return rows->NewBuffer(); }

void StoreTable::Reset(const v1::TableState* state, std::unique_ptr<SparseRows> loaded,
                       const v1::JobConfig& config, absl::Span<const uint64_t> resume_steps) {
  ResetEngine(config, resume_steps);
  if (state == nullptr) {
    rows->Clear();
    version_ = 0;
    counters.LoadState(nullptr);
    return;
  }
  rows = std::move(loaded);
  version_ = state->version();
  counters.LoadState(state->has_counters() ? &state->counters() : nullptr);
  LoadMarks(state->marks());
}

// A row push names no program optimizer (it has no PushRequest.optimizers):
// the table's rows run the job's.
void StoreTable::Update(const GradientRef& grad, const UpdateStep& step) {
  const bool taken = accepting_ids != nullptr && grad.ids.data() == accepting_ids;
  rows->Apply(grad, step.lr, taken);
  push_applied |= taken;
}

void StoreTable::SnapshotInto(v1::ShardCheckpointFile* into, bool changes_only) {
  v1::TableState* out = into->add_tables();
  out->set_name(spec.name());
  out->set_version(version_);
  if (changes_only) {
    rows->SaveChanged(out);
  } else {
    rows->Save(out);
  }
  rows->ForgetChanges();
  SnapshotMarks(out->mutable_marks(), out->mutable_held_from());
  SnapshotCounters(out->mutable_counters());
}

// ---- TargetLocks ----

void TargetLocks::Lock() {
  std::sort(targets_.begin(), targets_.end(),
            [](const StoreTarget* a, const StoreTarget* b) { return a->order < b->order; });
  for (StoreTarget* t : targets_) t->mu.Lock();
}

TargetLocks::~TargetLocks() {
  for (auto it = targets_.rbegin(); it != targets_.rend(); ++it) (*it)->mu.Unlock();
}

}  // namespace grps
