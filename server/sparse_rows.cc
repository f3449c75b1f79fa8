#include "server/sparse_rows.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "job/sparse_tables.h"
#include "server/chunk_optimizer.h"

namespace grps {
namespace {

// The rows of a sync step's sum or a held ssp gradient: each id once, in the
// order first added.
class SparseGradientBuffer final : public GradientBuffer {
 public:
  explicit SparseGradientBuffer(uint32_t dim) : dim_(dim) {}

  void Add(const GradientRef& g) override {
    for (size_t i = 0; i < g.ids.size(); ++i) {
      auto [it, added] = position_.try_emplace(g.ids[i], ids_.size());
      const float* src = g.values.data() + i * dim_;
      if (added) {
        ids_.push_back(g.ids[i]);
        values_.insert(values_.end(), src, src + dim_);
        continue;
      }
      float* dst = values_.data() + it->second * dim_;
      for (uint32_t k = 0; k < dim_; ++k) dst[k] += src[k];
    }
  }
  void Scale(float factor) override {
    for (float& v : values_) v *= factor;
  }
  void Clear() override {
    position_.clear();
    ids_.clear();
    values_.clear();
  }
  GradientRef Ref() const override {
    return GradientRef{absl::MakeConstSpan(values_), absl::MakeConstSpan(ids_)};
  }

 private:
  const uint32_t dim_;
  absl::flat_hash_map<int64_t, size_t> position_;
  std::vector<int64_t> ids_;
  std::vector<float> values_;
};

// A managed table's slot that holds no row (last_).
constexpr int64_t kFreeSlot = std::numeric_limits<int64_t>::min();
// The ids a managed table counts towards admission at most: twice its
// max_rows_per_shard, at least kMinPending; without one, kMaxPending.
constexpr uint64_t kMinPending = uint64_t{1} << 16;
constexpr uint64_t kMaxPending = uint64_t{1} << 20;

// `n` less a sixteenth: what an eviction keeps of a bound of `n`.
uint64_t LowWater(uint64_t n) { return n - n / 16; }

}  // namespace

SparseRows::SparseRows(const v1::SparseTableSpec& spec, const v1::OptimizerConfig& optimizer,
                       uint64_t seed, Backend* backend)
    : spec_(spec),
      optimizer_(optimizer),
      seed_(seed),
      backend_(backend),
      dim_(spec.dim()),
      slots_(OptimizerStateSlots(optimizer.kind())),
      state_width_(SparseStateWidth(spec)),
      stride_(spec.dim() + static_cast<size_t>(SparseStateWidth(spec)) *
                               OptimizerStateSlots(optimizer.kind())),
      managed_(IsManagedTable(spec)) {}

absl::Status SparseRows::CheckRoom(absl::Span<const int64_t> ids) const {
  // A managed table's eviction keeps its rows within the limit.
  if (const uint64_t limit = spec_.max_rows_per_shard(); !managed_ && limit > 0) {
    uint64_t missing = 0;
    absl::flat_hash_set<int64_t> counted;  // ids may repeat
    ForEachSlot(ids, Reads::kMeta, [&](size_t i, std::optional<uint32_t> held) {
      if (!held.has_value() && counted.insert(ids[i]).second) ++missing;
    });
    if (index_.size() + missing > limit)
      return absl::FailedPreconditionError(absl::StrCat(
          "sparse table '", spec_.name(), "' holds ", index_.size(), " rows on this shard; ",
          missing, " more would pass its limit of ", limit, " (max_rows_per_shard)"));
  }
  if (index_.size() + ids.size() > std::numeric_limits<uint32_t>::max())
    return absl::FailedPreconditionError(absl::StrCat(
        "sparse table '", spec_.name(), "' cannot hold more than 2^32 rows per shard"));
  return absl::OkStatus();
}

absl::Status SparseRows::Ensure(absl::Span<const int64_t> ids) {
  if (absl::Status s = CheckRoom(ids); !s.ok()) return s;
  if (!managed_)
    ForEachSlot(ids, Reads::kMeta, [&](size_t i, std::optional<uint32_t> held) {
      if (!held.has_value()) SlotOf(ids[i]);
    });
  return absl::OkStatus();
}

uint32_t SparseRows::SlotOf(int64_t id) {
  if (std::optional<uint32_t> held = index_.Find(id, IdOf()); held.has_value()) return *held;
  uint32_t slot;
  if (!free_.empty()) {
    slot = free_.back();
    free_.pop_back();
  } else {
    slot = NewSlot();
    if (managed_) last_.push_back(kFreeSlot);
  }
  MetaAt(slot) = SlotMeta{id, 0, 0};
  index_.Insert(id, slot, IdOf());
  float* row = RowAt(slot);
  InitializeSparseRow(spec_, seed_, id, row);
  std::fill(row + dim_, row + stride_, 0.0f);
  if (managed_) last_[slot] = clock_;
  MarkChanged(slot);
  return slot;
}

uint32_t SparseRows::NewSlot() {
  const uint32_t slot = slots_used_++;
  if (slot % kRowsPerBlock == 0) {
    blocks_.push_back(std::make_unique<float[]>(kRowsPerBlock * stride_));
    meta_.push_back(std::make_unique<SlotMeta[]>(kRowsPerBlock));
  }
  return slot;
}

void SparseRows::Read(absl::Span<const int64_t> ids, float* out) {
  ForEachSlot(ids, Reads::kRows, [&](size_t i, std::optional<uint32_t> held) {
    ++total_traffic_;
    if (managed_ && !held.has_value()) {
      // Not held (not yet admitted, or evicted): what a new row would hold.
      InitializeSparseRow(spec_, seed_, ids[i], out + i * dim_);
      return;
    }
    const uint32_t slot = held.has_value() ? *held : SlotOf(ids[i]);
    std::memcpy(out + i * dim_, RowAt(slot), dim_ * sizeof(float));
    CountTraffic(slot);
  });
}

void SparseRows::TakePush(absl::Span<const int64_t> ids) {
  ForEachSlot(ids, Reads::kMeta, [&](size_t i, std::optional<uint32_t> held) {
    if (managed_ && !held.has_value()) return;
    CountTraffic(held.has_value() ? *held : SlotOf(ids[i]));
    ++total_traffic_;
  });
}

void SparseRows::Apply(const GradientRef& grad, float lr, bool push_taken) {
  ForEachSlot(grad.ids, Reads::kRows, [&](size_t i, std::optional<uint32_t> held) {
    uint32_t slot;
    if (managed_) {
      const std::optional<uint32_t> admitted = held.has_value() ? held : AdmittedSlot(grad.ids[i]);
      if (!admitted.has_value()) return;
      slot = *admitted;
      last_[slot] = clock_ + 1;
    } else {
      slot = held.has_value() ? *held : SlotOf(grad.ids[i]);
    }
    if (push_taken && (held.has_value() || !managed_)) {  // as TakePush counts
      CountTraffic(slot);
      ++total_traffic_;
    }
    float* row = RowAt(slot);
    float* a = row + dim_;
    float* b = a + state_width_;
    const float* g = grad.values.data() + i * dim_;
    const uint32_t t = ++MetaAt(slot).updates;
    MarkChanged(slot);
    if (spec_.rowwise_adagrad()) {
      RowwiseAdagradStep(lr, row, g, a);
    } else {
      ApplyOptimizerStep(optimizer_, *backend_, lr, t, row, g, a, b, dim_);
    }
  });
  if (!managed_) return;
  ++clock_;
  EvictIdle();
  EvictPastCapacity();
  BoundPending();
}

void SparseRows::RowwiseAdagradStep(float lr, float* row, const float* grad, float* accum) const {
  const float wd = optimizer_.weight_decay();
  double squares = 0;
  for (uint32_t i = 0; i < dim_; ++i) {
    const float g = grad[i] + wd * row[i];
    squares += static_cast<double>(g) * g;
  }
  *accum += static_cast<float>(squares / dim_);
  const float step = lr / (std::sqrt(*accum) + optimizer_.epsilon());
  for (uint32_t i = 0; i < dim_; ++i) row[i] -= step * (grad[i] + wd * row[i]);
}

std::optional<uint32_t> SparseRows::AdmittedSlot(int64_t id) {
  if (std::optional<uint32_t> held = index_.Find(id, IdOf()); held.has_value()) return *held;
  if (spec_.admit_after() > 1) {
    Pending& p = pending_[id];
    p.last = clock_ + 1;
    if (++p.count < spec_.admit_after()) {
      ++counts_.dropped;
      return std::nullopt;
    }
    pending_.erase(id);
    ++counts_.admitted;
  }
  return SlotOf(id);
}

void SparseRows::Remove(uint32_t slot) {
  if (track_changes_) removed_.insert(MetaAt(slot).id);
  if (Changed(slot)) changed_[slot / 64] &= ~(uint64_t{1} << (slot % 64));
  index_.Erase(MetaAt(slot).id, IdOf());
  last_[slot] = kFreeSlot;
  MetaAt(slot).traffic = 0;
  free_.push_back(slot);
  ++counts_.evicted;
}

void SparseRows::EvictIdle() {
  const uint64_t idle = spec_.evict_after_updates();
  if (idle == 0 || clock_ % static_cast<int64_t>(std::max<uint64_t>(1, idle / 16)) != 0) return;
  const int64_t oldest = clock_ - static_cast<int64_t>(idle);  // last update kept: >= this
  for (uint32_t slot = 0; slot < last_.size(); ++slot)
    if (last_[slot] != kFreeSlot && last_[slot] < oldest) Remove(slot);
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (it->second.last < oldest) {
      pending_.erase(it++);
    } else {
      ++it;
    }
  }
}

void SparseRows::EvictPastCapacity() {
  const uint64_t limit = spec_.max_rows_per_shard();
  if (spec_.eviction() == v1::SparseTableSpec::EVICTION_NONE || limit == 0 ||
      index_.size() <= limit)
    return;
  // (how often, how recently, id) for LFU; (how recently, id) for LRU:
  // the smallest leave.
  const bool lfu = spec_.eviction() == v1::SparseTableSpec::EVICTION_LFU;
  std::vector<std::tuple<int64_t, int64_t, int64_t, uint32_t>> keys;
  keys.reserve(index_.size());
  for (uint32_t slot = 0; slot < last_.size(); ++slot) {
    if (last_[slot] == kFreeSlot) continue;
    const SlotMeta& meta = MetaAt(slot);
    keys.emplace_back(lfu ? meta.updates : last_[slot], lfu ? last_[slot] : 0, meta.id, slot);
  }
  const size_t leave = keys.size() - LowWater(limit);
  std::nth_element(keys.begin(), keys.begin() + (leave - 1), keys.end());
  for (size_t i = 0; i < leave; ++i) Remove(std::get<3>(keys[i]));
}

void SparseRows::BoundPending() {
  const uint64_t rows = spec_.max_rows_per_shard();
  const uint64_t limit = rows > 0 ? std::max(2 * rows, kMinPending) : kMaxPending;
  if (pending_.size() <= limit) return;
  std::vector<std::pair<int64_t, int64_t>> keys;  // (last named, id): the smallest go
  keys.reserve(pending_.size());
  for (const auto& [id, p] : pending_) keys.emplace_back(p.last, id);
  const size_t leave = keys.size() - LowWater(limit);
  std::nth_element(keys.begin(), keys.begin() + (leave - 1), keys.end());
  for (size_t i = 0; i < leave; ++i) pending_.erase(keys[i].second);
}

uint64_t SparseRows::bytes() const {
  const uint64_t rows = blocks_.size() * static_cast<uint64_t>(kRowsPerBlock) *
                        (stride_ * sizeof(float) + sizeof(SlotMeta));
  const uint64_t index = index_.bytes();
  const uint64_t managed = last_.capacity() * sizeof(int64_t) +
                           free_.capacity() * sizeof(uint32_t) +
                           pending_.capacity() * (sizeof(std::pair<int64_t, Pending>) + 1);
  const uint64_t changes =
      changed_.capacity() * sizeof(uint64_t) + removed_.capacity() * (sizeof(int64_t) + 1);
  return rows + index + managed + changes;
}

double SparseRows::hottest_share() const {
  if (total_traffic_ == 0 || slots_used_ == 0) return 0;
  const uint64_t n = slots_used_;
  const uint64_t step = n > kHotSample ? n / kHotSample : 1;
  std::vector<uint32_t> sample;
  sample.reserve(std::min<uint64_t>(n, kHotSample + 1));
  uint64_t sampled_total = 0;
  for (uint64_t i = 0; i < n; i += step) {
    const uint32_t traffic = MetaAt(static_cast<uint32_t>(i)).traffic;
    sample.push_back(traffic);
    sampled_total += traffic;
  }
  if (sampled_total == 0) return 0;
  const size_t top = std::max<size_t>(1, sample.size() / 100);
  std::nth_element(sample.begin(), sample.begin() + (top - 1), sample.end(),
                   std::greater<uint32_t>());
  uint64_t hot = 0;
  for (size_t i = 0; i < top; ++i) hot += sample[i];
  return static_cast<double>(hot) / static_cast<double>(sampled_total);
}

void SparseRows::Clear() {
  index_.Clear();
  blocks_.clear();
  meta_.clear();
  slots_used_ = 0;
  total_traffic_ = 0;
  last_.clear();
  free_.clear();
  clock_ = 0;
  pending_.clear();
  ForgetChanges();
}

std::vector<uint32_t> SparseRows::HeldSlots() const {
  // Every slot below the row count (an unmanaged table's are dense), or a
  // managed table's held ones.
  std::vector<uint32_t> slots;
  slots.reserve(index_.size());
  if (managed_) {
    for (uint32_t slot = 0; slot < last_.size(); ++slot)
      if (last_[slot] != kFreeSlot) slots.push_back(slot);
  } else {
    for (uint32_t slot = 0; slot < index_.size(); ++slot) slots.push_back(slot);
  }
  return slots;
}

void SparseRows::Save(v1::TableState* out) const { SaveSlots(HeldSlots(), out); }

void SparseRows::SaveChanged(v1::TableState* out) const {
  std::vector<uint32_t> slots;
  for (uint32_t word = 0; word < changed_.size(); ++word)
    for (uint64_t bits = changed_[word]; bits != 0; bits &= bits - 1)
      slots.push_back(word * 64 + static_cast<uint32_t>(__builtin_ctzll(bits)));
  SaveSlots(slots, out);
  std::vector<int64_t> removed(removed_.begin(), removed_.end());
  std::sort(removed.begin(), removed.end());
  for (int64_t id : removed) out->add_removed_ids(id);
}

void SparseRows::ForgetChanges() {
  changed_.clear();
  removed_.clear();
}

uint64_t SparseRows::changed_rows() const {
  uint64_t n = 0;
  for (uint64_t word : changed_) n += static_cast<uint64_t>(__builtin_popcountll(word));
  return n;
}

void SparseRows::SaveSlots(const std::vector<uint32_t>& slots, v1::TableState* out) const {
  const size_t n = slots.size();
  const size_t row_bytes = static_cast<size_t>(dim_) * sizeof(float);
  const size_t state_bytes = static_cast<size_t>(state_width_) * sizeof(float);
  out->set_dim(dim_);
  if (state_width_ != dim_) out->set_state_width(state_width_);
  for (uint32_t slot : slots) out->add_ids(MetaAt(slot).id);
  // Each part of a row (values, then each state slot) goes to its own field.
  out->mutable_values()->resize(n * row_bytes);
  char* values = out->mutable_values()->data();
  std::vector<char*> states;
  for (uint32_t k = 0; k < slots_; ++k) {
    std::string* slot = out->add_optimizer_state();
    slot->resize(n * state_bytes);
    states.push_back(slot->data());
  }
  for (size_t i = 0; i < n; ++i) {
    const float* row = RowAt(slots[i]);
    std::memcpy(values + i * row_bytes, row, row_bytes);
    for (size_t k = 0; k < states.size(); ++k)
      std::memcpy(states[k] + i * state_bytes, row + dim_ + k * state_width_, state_bytes);
    out->add_updates(MetaAt(slots[i]).updates);
  }
  if (!managed_) return;
  out->set_clock(static_cast<uint64_t>(clock_));
  for (uint32_t slot : slots) out->add_row_idle(static_cast<uint64_t>(clock_ - last_[slot]));
  // Waiting ids by id: the same state saves the same bytes.
  std::vector<int64_t> waiting;
  waiting.reserve(pending_.size());
  for (const auto& [id, p] : pending_) waiting.push_back(id);
  std::sort(waiting.begin(), waiting.end());
  for (int64_t id : waiting) {
    const Pending& p = pending_.at(id);
    out->add_pending_ids(id);
    out->add_pending_counts(p.count);
    out->add_pending_idle(static_cast<uint64_t>(clock_ - p.last));
  }
}

absl::Status SparseRows::Load(const v1::TableState& state) {
  auto bad = [&](auto... why) {
    return absl::InvalidArgumentError(
        absl::StrCat("sparse table '", spec_.name(), "' in the checkpoint: ", why...));
  };
  const size_t n = static_cast<size_t>(state.ids_size());
  const size_t row_bytes = static_cast<size_t>(dim_) * sizeof(float);
  if (absl::Status s = CheckTableState(state, dim_, static_cast<int>(slots_)); !s.ok())
    return bad(s.message());
  if (slots_ > 0 && TableStateWidth(state) != state_width_)
    return bad("optimizer state of ", TableStateWidth(state), " floats a row, this table keeps ",
               state_width_, " (rowwise_adagrad differs)");
  const size_t state_bytes = static_cast<size_t>(state_width_) * sizeof(float);
  if (!managed_ && spec_.max_rows_per_shard() > 0 && n > spec_.max_rows_per_shard())
    return absl::FailedPreconditionError(
        absl::StrCat("sparse table '", spec_.name(), "': the checkpoint puts ", n,
                     " rows on this shard, past its limit of ", spec_.max_rows_per_shard(),
                     " (max_rows_per_shard): restore into more shards, or raise the limit"));
  Clear();
  // CheckTableState: every idle time within the clock.
  clock_ = static_cast<int64_t>(state.clock());
  index_.Reserve(n, IdOf());
  std::vector<const char*> states;
  for (const std::string& slot : state.optimizer_state()) states.push_back(slot.data());
  for (size_t i = 0; i < n; ++i) {
    const int64_t id = state.ids(static_cast<int>(i));
    if (Held(id)) return bad("row ", id, " appears twice");
    const uint32_t slot = NewSlot();
    MetaAt(slot) = SlotMeta{id, state.updates_size() == 0 ? 0 : state.updates(static_cast<int>(i)),
                            0};
    index_.Insert(id, slot, IdOf());
    float* row = RowAt(slot);
    std::memcpy(row, state.values().data() + i * row_bytes, row_bytes);
    for (size_t k = 0; k < states.size(); ++k)
      std::memcpy(row + dim_ + k * state_width_, states[k] + i * state_bytes, state_bytes);
    if (managed_) {
      const uint64_t idle = state.row_idle_size() == 0 ? 0 : state.row_idle(static_cast<int>(i));
      last_.push_back(clock_ - static_cast<int64_t>(idle));
    }
  }
  if (!managed_) return absl::OkStatus();  // nothing changed since (Clear)
  for (int i = 0; i < state.pending_ids_size(); ++i) {
    Pending& p = pending_[state.pending_ids(i)];
    p.count = state.pending_counts(i);
    p.last = clock_ - static_cast<int64_t>(state.pending_idle(i));
  }
  // A restore into fewer shards may bring more than the capacity.
  EvictPastCapacity();
  BoundPending();
  ForgetChanges();  // the loaded state is the base of what changes next
  return absl::OkStatus();
}

std::unique_ptr<GradientBuffer> SparseRows::NewBuffer() const {
  return std::make_unique<SparseGradientBuffer>(dim_);
}

const float* SparseRows::TEST_Row(int64_t id) const {
  const std::optional<uint32_t> slot = index_.Find(id, IdOf());
  return slot.has_value() ? RowAt(*slot) : nullptr;
}

}  // namespace grps
