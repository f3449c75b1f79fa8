#include "server/sparse_rows.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
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

}  // namespace

SparseRows::SparseRows(const v1::SparseTableSpec& spec,
                       const v1::OptimizerConfig& optimizer, uint64_t seed,
                       Backend* backend)
    : spec_(spec),
      optimizer_(optimizer),
      seed_(seed),
      backend_(backend),
      dim_(spec.dim()),
      slots_(OptimizerStateSlots(optimizer.kind())),
      stride_(static_cast<size_t>(spec.dim()) * (1 + OptimizerStateSlots(optimizer.kind()))) {}

absl::Status SparseRows::Ensure(absl::Span<const int64_t> ids) {
  const uint64_t limit = spec_.max_rows_per_shard();
  if (limit > 0) {
    uint64_t missing = 0;
    absl::flat_hash_map<int64_t, bool> counted;  // ids may repeat
    for (int64_t id : ids)
      if (!index_.contains(id) && counted.try_emplace(id, true).second) ++missing;
    if (index_.size() + missing > limit)
      return absl::FailedPreconditionError(absl::StrCat(
          "sparse table '", spec_.name(), "' holds ", index_.size(),
          " rows on this shard; ", missing, " more would pass its limit of ", limit,
          " (max_rows_per_shard)"));
  }
  if (index_.size() + ids.size() > std::numeric_limits<uint32_t>::max())
    return absl::FailedPreconditionError(absl::StrCat(
        "sparse table '", spec_.name(), "' cannot hold more than 2^32 rows per shard"));
  for (int64_t id : ids) SlotOf(id);
  return absl::OkStatus();
}

uint32_t SparseRows::SlotOf(int64_t id) {
  auto [it, added] = index_.try_emplace(id, static_cast<uint32_t>(updates_.size()));
  if (!added) return it->second;
  const uint32_t slot = it->second;
  if (slot % kRowsPerBlock == 0)
    blocks_.push_back(std::make_unique<float[]>(kRowsPerBlock * stride_));
  float* row = RowAt(slot);
  InitializeSparseRow(spec_, seed_, id, row);
  std::fill(row + dim_, row + stride_, 0.0f);
  updates_.push_back(0);
  traffic_.push_back(0);
  return slot;
}

void SparseRows::Read(absl::Span<const int64_t> ids, float* out) {
  for (size_t i = 0; i < ids.size(); ++i) {
    const uint32_t slot = SlotOf(ids[i]);
    std::memcpy(out + i * dim_, RowAt(slot), dim_ * sizeof(float));
    if (traffic_[slot] != std::numeric_limits<uint32_t>::max()) ++traffic_[slot];
    ++total_traffic_;
  }
}

void SparseRows::CountPushed(absl::Span<const int64_t> ids) {
  for (int64_t id : ids) {
    auto it = index_.find(id);
    if (it == index_.end()) continue;
    if (traffic_[it->second] != std::numeric_limits<uint32_t>::max()) ++traffic_[it->second];
    ++total_traffic_;
  }
}

void SparseRows::Apply(const GradientRef& grad, float lr) {
  for (size_t i = 0; i < grad.ids.size(); ++i) {
    const uint32_t slot = SlotOf(grad.ids[i]);
    float* row = RowAt(slot);
    float* a = row + dim_;
    float* b = row + 2 * static_cast<size_t>(dim_);
    const float* g = grad.values.data() + i * dim_;
    const uint32_t t = ++updates_[slot];
    ApplyOptimizerStep(optimizer_, *backend_, lr, t, row, g, a, b, dim_);
  }
}

uint64_t SparseRows::bytes() const {
  const uint64_t rows = blocks_.size() * static_cast<uint64_t>(kRowsPerBlock) * stride_ * sizeof(float);
  const uint64_t counters = (updates_.capacity() + traffic_.capacity()) * sizeof(uint32_t);
  // A flat_hash_map slot holds the pair and one control byte.
  const uint64_t index = index_.capacity() * (sizeof(std::pair<int64_t, uint32_t>) + 1);
  return rows + counters + index;
}

double SparseRows::hottest_share() const {
  if (total_traffic_ == 0 || traffic_.empty()) return 0;
  const uint64_t n = traffic_.size();
  const uint64_t step = n > kHotSample ? n / kHotSample : 1;
  std::vector<uint32_t> sample;
  sample.reserve(std::min<uint64_t>(n, kHotSample + 1));
  uint64_t sampled_total = 0;
  for (uint64_t i = 0; i < n; i += step) {
    sample.push_back(traffic_[i]);
    sampled_total += traffic_[i];
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
  index_.clear();
  blocks_.clear();
  updates_.clear();
  traffic_.clear();
  total_traffic_ = 0;
}

void SparseRows::Save(v1::TableState* out) const {
  const size_t n = index_.size();
  const size_t row_bytes = static_cast<size_t>(dim_) * sizeof(float);
  out->set_dim(dim_);
  out->mutable_ids()->Resize(static_cast<int>(n), 0);
  for (const auto& [id, slot] : index_) out->set_ids(static_cast<int>(slot), id);
  // Each part of a row (values, then each state slot) goes to its own field.
  std::vector<char*> parts;
  out->mutable_values()->resize(n * row_bytes);
  parts.push_back(out->mutable_values()->data());
  for (uint32_t k = 0; k < slots_; ++k) {
    std::string* slot = out->add_optimizer_state();
    slot->resize(n * row_bytes);
    parts.push_back(slot->data());
  }
  for (size_t slot = 0; slot < n; ++slot) {
    const float* row = RowAt(static_cast<uint32_t>(slot));
    for (size_t k = 0; k < parts.size(); ++k)
      std::memcpy(parts[k] + slot * row_bytes, row + k * dim_, row_bytes);
  }
  out->mutable_updates()->Add(updates_.begin(), updates_.begin() + n);
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
  if (spec_.max_rows_per_shard() > 0 && n > spec_.max_rows_per_shard())
    return absl::FailedPreconditionError(absl::StrCat(
        "sparse table '", spec_.name(), "': the checkpoint puts ", n,
        " rows on this shard, past its limit of ", spec_.max_rows_per_shard(),
        " (max_rows_per_shard): restore into more shards, or raise the limit"));
  Clear();
  index_.reserve(n);
  updates_.reserve(n);
  traffic_.reserve(n);
  std::vector<const char*> parts{state.values().data()};
  for (const std::string& slot : state.optimizer_state()) parts.push_back(slot.data());
  for (size_t i = 0; i < n; ++i) {
    const uint32_t slot = static_cast<uint32_t>(i);
    if (!index_.try_emplace(state.ids(static_cast<int>(i)), slot).second)
      return bad("row ", state.ids(static_cast<int>(i)), " appears twice");
    if (slot % kRowsPerBlock == 0)
      blocks_.push_back(std::make_unique<float[]>(kRowsPerBlock * stride_));
    float* row = RowAt(slot);
    for (size_t k = 0; k < parts.size(); ++k)
      std::memcpy(row + k * dim_, parts[k] + i * row_bytes, row_bytes);
    updates_.push_back(state.updates_size() == 0 ? 0 : state.updates(static_cast<int>(i)));
    traffic_.push_back(0);
  }
  return absl::OkStatus();
}

std::unique_ptr<GradientBuffer> SparseRows::NewBuffer() const {
  return std::make_unique<SparseGradientBuffer>(dim_);
}

const float* SparseRows::TEST_Row(int64_t id) const {
  auto it = index_.find(id);
  return it == index_.end() ? nullptr : RowAt(it->second);
}

}  // namespace grps
