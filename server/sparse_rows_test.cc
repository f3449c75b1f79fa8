// SparseRows as a managed table (SparseTableSpec.eviction, admit_after,
// evict_after_updates): a pull creates nothing, an update creates its rows
// once admitted, rows past the capacity or idle too long leave, chosen from
// the updates alone (so the same updates in another order keep the same
// rows), and a checkpoint of the table continues exactly as the table would.
#include "server/sparse_rows.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "job/sparse_tables.h"
#include "tensor/backend.h"

namespace grps {
namespace {

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

constexpr uint32_t kDim = 2;
constexpr uint64_t kSeed = 7;
constexpr float kLr = 0.5f;

v1::SparseTableSpec Managed(v1::SparseTableSpec::Eviction eviction, uint64_t max_rows,
                            uint32_t admit_after = 0, uint64_t evict_after = 0) {
  v1::SparseTableSpec spec;
  spec.set_name("emb");
  spec.set_dim(kDim);
  spec.set_eviction(eviction);
  spec.set_max_rows_per_shard(max_rows);
  spec.set_admit_after(admit_after);
  spec.set_evict_after_updates(evict_after);
  return spec;
}

v1::OptimizerConfig Sgd() {
  v1::OptimizerConfig opt;
  opt.set_kind(v1::OPTIMIZER_SGD);
  return opt;
}

class ManagedRowsTest : public ::testing::Test {
 protected:
  std::unique_ptr<SparseRows> Make(const v1::SparseTableSpec& spec,
                                   const v1::OptimizerConfig& opt = Sgd()) {
    return std::make_unique<SparseRows>(spec, opt, kSeed, backend_.get());
  }

  // One update of `rows`: a gradient of 1 on every element of each id.
  static void Update(SparseRows& rows, const std::vector<int64_t>& ids) {
    const std::vector<float> grad(ids.size() * kDim, 1.0f);
    rows.Apply(GradientRef{grad, ids}, kLr);
  }

  static std::vector<float> Initial(const v1::SparseTableSpec& spec, int64_t id) {
    std::vector<float> row(kDim);
    InitializeSparseRow(spec, kSeed, id, row.data());
    return row;
  }

  // What a checkpoint holds of the table, by id: values, updates, idle
  // time; and the clock and the ids waiting, as saved.
  using Rows = std::map<int64_t, std::tuple<std::vector<float>, uint32_t, uint64_t>>;
  static Rows Saved(const SparseRows& rows, v1::TableState* state = nullptr) {
    v1::TableState local;
    if (state == nullptr) state = &local;
    state->Clear();
    rows.Save(state);
    Rows out;
    const float* values = reinterpret_cast<const float*>(state->values().data());
    for (int i = 0; i < state->ids_size(); ++i)
      out[state->ids(i)] = {std::vector<float>(values + i * kDim, values + (i + 1) * kDim),
                            state->updates(i), state->row_idle(i)};
    return out;
  }

  std::unique_ptr<Backend> backend_ = CreateCpuBackend();
};

TEST_F(ManagedRowsTest, APullCreatesNoRowAndReadsTheInitializersValues) {
  const v1::SparseTableSpec spec = Managed(v1::SparseTableSpec::EVICTION_LRU, 4);
  std::unique_ptr<SparseRows> rows = Make(spec);
  ASSERT_TRUE(rows->Ensure({1, 2, 3, 4, 5, 6}).ok());  // never full, creates nothing
  std::vector<float> out(2 * kDim);
  rows->Read({5, 9}, out.data());
  EXPECT_EQ(rows->size(), 0u);
  EXPECT_THAT(std::vector<float>(out.begin(), out.begin() + kDim),
              ElementsAreArray(Initial(spec, 5)));
  EXPECT_THAT(std::vector<float>(out.begin() + kDim, out.end()),
              ElementsAreArray(Initial(spec, 9)));
  // An update creates the row from the same values.
  Update(*rows, {5});
  ASSERT_NE(rows->TEST_Row(5), nullptr);
  EXPECT_FLOAT_EQ(rows->TEST_Row(5)[0], Initial(spec, 5)[0] - kLr);
}

TEST_F(ManagedRowsTest, PastItsCapacityTheLeastRecentlyUpdatedRowsLeave) {
  // Capacity 16: an eviction keeps 15 (a sixteenth less).
  std::unique_ptr<SparseRows> rows = Make(Managed(v1::SparseTableSpec::EVICTION_LRU, 16));
  for (int64_t id = 0; id < 16; ++id) Update(*rows, {id});
  EXPECT_EQ(rows->size(), 16u);
  EXPECT_EQ(rows->managed_counts().evicted, 0u);
  Update(*rows, {3});    // 3 is recent again
  Update(*rows, {100});  // 17 rows: 0, 1 leave (the oldest, 3 skipped)
  EXPECT_EQ(rows->size(), 15u);
  EXPECT_EQ(rows->managed_counts().evicted, 2u);
  EXPECT_EQ(rows->TEST_Row(0), nullptr);
  EXPECT_EQ(rows->TEST_Row(1), nullptr);
  EXPECT_NE(rows->TEST_Row(2), nullptr);
  EXPECT_NE(rows->TEST_Row(3), nullptr);
  EXPECT_NE(rows->TEST_Row(100), nullptr);
  // A row that left starts again from its initializer's values.
  Update(*rows, {0});
  EXPECT_FLOAT_EQ(rows->TEST_Row(0)[0],
                  Initial(Managed(v1::SparseTableSpec::EVICTION_LRU, 16), 0)[0] - kLr);
  for (int64_t id = 200; id < 300; ++id) {
    Update(*rows, {id});
    ASSERT_LE(rows->size(), 16u) << "after " << id;
  }
}

TEST_F(ManagedRowsTest, LfuKeepsTheRowsUpdatedMostOften) {
  std::unique_ptr<SparseRows> rows = Make(Managed(v1::SparseTableSpec::EVICTION_LFU, 16));
  for (int round = 0; round < 3; ++round)
    for (int64_t id = 0; id < 8; ++id) Update(*rows, {id});
  for (int64_t id = 8; id < 40; ++id) Update(*rows, {id});
  // The hot rows stay through 32 new ids; the new ones came and went.
  for (int64_t id = 0; id < 8; ++id) EXPECT_NE(rows->TEST_Row(id), nullptr) << id;
  EXPECT_NE(rows->TEST_Row(39), nullptr);  // the newest is kept
  EXPECT_LE(rows->size(), 16u);
  EXPECT_GT(rows->managed_counts().evicted, 0u);
}

TEST_F(ManagedRowsTest, ARowIsCreatedByItsAdmitAfterThUpdateAndEarlierOnesAreDropped) {
  const v1::SparseTableSpec spec = Managed(v1::SparseTableSpec::EVICTION_NONE, 0, 3);
  std::unique_ptr<SparseRows> rows = Make(spec);
  Update(*rows, {1, 2});
  Update(*rows, {1});
  EXPECT_EQ(rows->size(), 0u);
  EXPECT_EQ(rows->pending(), 2u);
  EXPECT_EQ(rows->managed_counts().dropped, 3u);
  Update(*rows, {1});  // the third: admitted, and this update applies
  ASSERT_NE(rows->TEST_Row(1), nullptr);
  EXPECT_FLOAT_EQ(rows->TEST_Row(1)[1], Initial(spec, 1)[1] - kLr);
  EXPECT_EQ(rows->TEST_Row(2), nullptr);
  EXPECT_EQ(rows->managed_counts().admitted, 1u);
  EXPECT_EQ(rows->pending(), 1u);
}

TEST_F(ManagedRowsTest, RowsIdleLongerThanEvictAfterUpdatesLeave) {
  // Checked every max(1, 4 / 16) = 1 update.
  std::unique_ptr<SparseRows> rows = Make(Managed(v1::SparseTableSpec::EVICTION_NONE, 0, 2, 4));
  Update(*rows, {1});                              // waiting: 1
  Update(*rows, {7, 8});                           // waiting: 1, 7, 8
  Update(*rows, {7, 8});                           // 7 and 8 admitted (updated at clock 3)
  for (int i = 0; i < 4; ++i) Update(*rows, {8});  // clock 7: 7 idle 4 updates, kept
  EXPECT_NE(rows->TEST_Row(7), nullptr);
  EXPECT_EQ(rows->pending(), 0u);  // 1, named at clock 1, waited past 4
  Update(*rows, {8});              // clock 8: 7 idle 5
  EXPECT_EQ(rows->TEST_Row(7), nullptr);
  EXPECT_NE(rows->TEST_Row(8), nullptr);
  EXPECT_EQ(rows->managed_counts().evicted, 1u);
}

TEST_F(ManagedRowsTest, TheSameUpdatesInAnotherOrderKeepTheSameRows) {
  // Sync sums a step's pushes in the order they arrive: the rows kept must
  // not depend on it. Ids 0..59 in steps of 12, capacity 20, admission 2.
  const v1::SparseTableSpec spec = Managed(v1::SparseTableSpec::EVICTION_LRU, 20, 2, 40);
  std::unique_ptr<SparseRows> a = Make(spec), b = Make(spec);
  for (int step = 0; step < 30; ++step) {
    std::vector<int64_t> ids;
    for (int k = 0; k < 12; ++k) ids.push_back((step * 7 + k * 5) % 60);
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    Update(*a, ids);
    std::reverse(ids.begin(), ids.end());
    Update(*b, ids);
  }
  EXPECT_GT(a->managed_counts().evicted, 0u);
  EXPECT_GT(a->managed_counts().admitted, 0u);
  EXPECT_EQ(Saved(*a), Saved(*b));
  EXPECT_EQ(a->pending(), b->pending());
}

TEST_F(ManagedRowsTest, TheIdsWaitingForAdmissionAreBounded) {
  // At most max(2 x max_rows_per_shard, 65536); past it the least recently
  // named leave, down to a sixteenth less.
  std::unique_ptr<SparseRows> rows = Make(Managed(v1::SparseTableSpec::EVICTION_LRU, 100, 2));
  std::vector<int64_t> ids(70000);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i);
  Update(*rows, ids);
  EXPECT_EQ(rows->pending(), 61440u);
  std::vector<int64_t> more(4096);
  for (size_t i = 0; i < more.size(); ++i) more[i] = 1000000 + static_cast<int64_t>(i);
  Update(*rows, more);
  EXPECT_EQ(rows->pending(), 65536u);  // at the bound
  Update(*rows, {2000000, 2000001});   // past it: down to 61440 again
  EXPECT_EQ(rows->pending(), 61440u);
  // What left was named first: the newest's second sighting admits it, the
  // oldest's counts as a first.
  Update(*rows, {2000000, 0});
  EXPECT_NE(rows->TEST_Row(2000000), nullptr);
  EXPECT_EQ(rows->TEST_Row(0), nullptr);
  EXPECT_EQ(rows->managed_counts().admitted, 1u);
}

TEST_F(ManagedRowsTest, ALoadedCheckpointGoesOnAsTheTableWould) {
  v1::OptimizerConfig adam;
  adam.set_kind(v1::OPTIMIZER_ADAM);
  adam.set_beta1(0.9f);
  adam.set_beta2(0.999f);
  adam.set_epsilon(1e-8f);
  const v1::SparseTableSpec spec = Managed(v1::SparseTableSpec::EVICTION_LFU, 16, 2, 32);
  std::unique_ptr<SparseRows> table = Make(spec, adam);
  auto step = [](SparseRows& rows, int s) {
    std::vector<int64_t> ids;
    for (int k = 0; k < 6; ++k) ids.push_back((s * 3 + k * k) % 40);
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    Update(rows, ids);
  };
  for (int s = 0; s < 20; ++s) step(*table, s);
  v1::TableState state;
  const Rows at_cut = Saved(*table, &state);
  EXPECT_GT(state.pending_ids_size(), 0);
  EXPECT_GT(state.clock(), 0u);
  std::unique_ptr<SparseRows> restored = Make(spec, adam);
  ASSERT_TRUE(restored->Load(state).ok());
  EXPECT_EQ(Saved(*restored), at_cut);
  for (int s = 20; s < 60; ++s) {
    step(*table, s);
    step(*restored, s);
  }
  EXPECT_EQ(Saved(*restored), Saved(*table));
  EXPECT_EQ(restored->pending(), table->pending());
}

TEST_F(ManagedRowsTest, ALoadPastTheCapacityEvicts) {
  // A restore into fewer shards: one shard takes the rows of two.
  const v1::SparseTableSpec big = Managed(v1::SparseTableSpec::EVICTION_LRU, 64);
  std::unique_ptr<SparseRows> table = Make(big);
  for (int64_t id = 0; id < 40; ++id) Update(*table, {id});
  v1::TableState state;
  Saved(*table, &state);
  std::unique_ptr<SparseRows> small = Make(Managed(v1::SparseTableSpec::EVICTION_LRU, 32));
  ASSERT_TRUE(small->Load(state).ok());
  EXPECT_EQ(small->size(), 30u);  // 32 less a sixteenth
  EXPECT_EQ(small->TEST_Row(9), nullptr);
  EXPECT_NE(small->TEST_Row(10), nullptr);  // the 30 most recent stay
}

TEST_F(ManagedRowsTest, AStateWhoseAgesDoNotFitIsRefused) {
  v1::TableState state;
  state.set_dim(kDim);
  state.add_ids(1);
  state.set_values(std::string(kDim * sizeof(float), '\0'));
  state.set_clock(3);
  state.add_row_idle(4);  // idle longer than the table's clock
  EXPECT_THAT(CheckTableState(state, kDim, 0).message(), HasSubstr("past the clock"));
  state.set_row_idle(0, 2);
  EXPECT_TRUE(CheckTableState(state, kDim, 0).ok());
  state.add_pending_ids(5);
  state.add_pending_counts(1);  // and no idle time
  EXPECT_THAT(CheckTableState(state, kDim, 0).message(), HasSubstr("waiting for admission"));
  std::unique_ptr<SparseRows> rows = Make(Managed(v1::SparseTableSpec::EVICTION_LRU, 8));
  EXPECT_FALSE(rows->Load(state).ok());
}

TEST_F(ManagedRowsTest, SaveChangedHoldsTheRowsCreatedOrUpdatedAndTheIdsThatLeftSince) {
  // Capacity 16 (an eviction keeps 15), LRU.
  std::unique_ptr<SparseRows> rows = Make(Managed(v1::SparseTableSpec::EVICTION_LRU, 16));
  rows->set_track_changes(true);
  for (int64_t id = 0; id < 10; ++id) Update(*rows, {id});
  EXPECT_EQ(rows->changed_rows(), 10u);
  rows->ForgetChanges();
  EXPECT_EQ(rows->changed_rows(), 0u);
  std::vector<float> out(kDim);
  rows->Read({4}, out.data());  // a pull changes nothing
  Update(*rows, {2, 5});
  for (int64_t id = 100; id < 107; ++id) Update(*rows, {id});  // 17 rows: 0, 1 leave
  Update(*rows, {0});                                           // 0 comes back
  v1::TableState changed;
  rows->SaveChanged(&changed);
  std::vector<int64_t> ids(changed.ids().begin(), changed.ids().end());
  std::sort(ids.begin(), ids.end());
  EXPECT_THAT(ids, ElementsAreArray({0, 2, 5, 100, 101, 102, 103, 104, 105, 106}));
  EXPECT_THAT(changed.removed_ids(), ElementsAreArray({0, 1}));  // 0 in both
  EXPECT_EQ(changed.row_idle_size(), changed.ids_size());
  EXPECT_EQ(changed.clock(), 19u);
  // Each changed row as Save has it.
  const Rows all = Saved(*rows);
  const float* values = reinterpret_cast<const float*>(changed.values().data());
  for (int i = 0; i < changed.ids_size(); ++i) {
    const auto& [row, updates, idle] = all.at(changed.ids(i));
    EXPECT_EQ(std::vector<float>(values + i * kDim, values + (i + 1) * kDim), row);
    EXPECT_EQ(changed.updates(i), updates);
    EXPECT_EQ(changed.row_idle(i), idle);
  }
  // A load starts from nothing changed.
  v1::TableState state;
  Saved(*rows, &state);
  std::unique_ptr<SparseRows> loaded = Make(Managed(v1::SparseTableSpec::EVICTION_LRU, 16));
  loaded->set_track_changes(true);
  ASSERT_TRUE(loaded->Load(state).ok());
  EXPECT_EQ(loaded->changed_rows(), 0u);
  v1::TableState none;
  loaded->SaveChanged(&none);
  EXPECT_EQ(none.ids_size(), 0);
  EXPECT_EQ(none.removed_ids_size(), 0);
}

TEST_F(ManagedRowsTest, WithoutIncrementalCheckpointsNoChangesAreKept) {
  // A table of a job with no incremental checkpoints keeps none of the ids
  // that left (over a long run they would pile up); one of a job with
  // them keeps every id that left since its previous checkpoint.
  std::unique_ptr<SparseRows> plain = Make(Managed(v1::SparseTableSpec::EVICTION_LRU, 16));
  std::unique_ptr<SparseRows> tracked = Make(Managed(v1::SparseTableSpec::EVICTION_LRU, 16));
  tracked->set_track_changes(true);
  for (int64_t id = 0; id < 10000; ++id) {
    Update(*plain, {id});
    Update(*tracked, {id});
  }
  EXPECT_GT(plain->managed_counts().evicted, 9000u);
  EXPECT_EQ(plain->changed_rows(), 0u);
  v1::TableState none, all;
  plain->SaveChanged(&none);
  EXPECT_EQ(none.removed_ids_size(), 0);
  tracked->SaveChanged(&all);
  EXPECT_EQ(static_cast<uint64_t>(all.removed_ids_size()), tracked->managed_counts().evicted);
  EXPECT_GT(tracked->bytes(), plain->bytes() + 9000 * sizeof(int64_t));
}

TEST(ManagedTableConfig, OptionsParseAndEvictionNeedsACapacity) {
  absl::StatusOr<std::vector<v1::SparseTableSpec>> tables = ParseSparseTables(
      "a:0:16:max_rows=1000:eviction=lfu:admit_after=2:evict_after=50,"
      "b:100:4:0.1");
  ASSERT_TRUE(tables.ok()) << tables.status();
  ASSERT_EQ(tables->size(), 2u);
  EXPECT_EQ((*tables)[0].max_rows_per_shard(), 1000u);
  EXPECT_EQ((*tables)[0].eviction(), v1::SparseTableSpec::EVICTION_LFU);
  EXPECT_EQ((*tables)[0].admit_after(), 2u);
  EXPECT_EQ((*tables)[0].evict_after_updates(), 50u);
  EXPECT_TRUE(IsManagedTable((*tables)[0]));
  EXPECT_FALSE(IsManagedTable((*tables)[1]));
  EXPECT_FLOAT_EQ((*tables)[1].init_scale(), 0.1f);
  EXPECT_THAT(ParseSparseTables("a:0:16:eviction=fifo").status().message(),
              HasSubstr("none, lru, lfu"));
  EXPECT_THAT(ParseSparseTables("a:0:16:size=3").status().message(), HasSubstr("unknown option"));
  EXPECT_FALSE(ParseSparseTables("a:0:16:max_rows=x").ok());
  EXPECT_FALSE(ParseSparseTables("a:0:max_rows=3").ok());  // DIM missing

  v1::JobConfig config;
  *config.add_sparse_tables() = Managed(v1::SparseTableSpec::EVICTION_LRU, 0);
  EXPECT_THAT(ValidateSparseTables(config).message(), HasSubstr("needs max_rows_per_shard"));
  config.mutable_sparse_tables(0)->set_max_rows_per_shard(10);
  EXPECT_TRUE(ValidateSparseTables(config).ok());
}

// Row-wise AdaGrad (SparseTableSpec.rowwise_adagrad): one accumulator a row,
// grown by the mean of the gradient's squares; each value steps by
// lr * g / (sqrt(accumulator) + epsilon).
class RowwiseAdagradTest : public ::testing::Test {
 protected:
  static constexpr uint32_t kWide = 4;
  static v1::SparseTableSpec Spec(bool rowwise) {
    v1::SparseTableSpec spec;
    spec.set_name("emb");
    spec.set_dim(kWide);
    spec.set_rowwise_adagrad(rowwise);
    return spec;
  }
  static v1::OptimizerConfig Adagrad() {
    v1::OptimizerConfig opt;
    opt.set_kind(v1::OPTIMIZER_ADAGRAD);
    opt.set_epsilon(1e-7f);
    return opt;
  }
  std::unique_ptr<SparseRows> Make(bool rowwise) {
    return std::make_unique<SparseRows>(Spec(rowwise), Adagrad(), kSeed, backend_.get());
  }
  std::unique_ptr<Backend> backend_ = CreateCpuBackend();
};

TEST_F(RowwiseAdagradTest, OneAccumulatorARowStepsEveryValueAlike) {
  std::unique_ptr<SparseRows> rows = Make(true);
  std::vector<float> want(kWide);
  InitializeSparseRow(Spec(true), kSeed, 3, want.data());
  const std::vector<float> grad = {1, 2, 3, 4};
  const std::vector<int64_t> ids = {3};
  float accum = 0;
  for (int update = 0; update < 2; ++update) {
    rows->Apply(GradientRef{grad, ids}, kLr);
    accum += (1 + 4 + 9 + 16) / 4.0f;
    const float step = kLr / (std::sqrt(accum) + 1e-7f);
    for (uint32_t i = 0; i < kWide; ++i) want[i] -= step * grad[i];
    const float* row = rows->TEST_Row(3);
    ASSERT_NE(row, nullptr);
    for (uint32_t i = 0; i < kWide; ++i) EXPECT_FLOAT_EQ(row[i], want[i]) << update << " " << i;
    EXPECT_FLOAT_EQ(row[kWide], accum) << "the row's one accumulator follows its values";
  }
}

TEST_F(RowwiseAdagradTest, ARowKeepsOneFloatOfStateInMemoryAndInACheckpoint) {
  std::unique_ptr<SparseRows> rowwise = Make(true);
  std::unique_ptr<SparseRows> elementwise = Make(false);
  std::vector<int64_t> ids(10000);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i * 7919);
  const std::vector<float> grad(ids.size() * kWide, 0.25f);
  for (SparseRows* rows : {rowwise.get(), elementwise.get()})
    rows->Apply(GradientRef{grad, ids}, kLr);
  // The same rows, index and counters: the state's dim - 1 floats a row less.
  EXPECT_GE(elementwise->bytes() - rowwise->bytes(), ids.size() * (kWide - 1) * sizeof(float));

  v1::TableState state;
  rowwise->Save(&state);
  EXPECT_EQ(state.state_width(), 1u);
  ASSERT_EQ(state.optimizer_state_size(), 1);
  EXPECT_EQ(state.optimizer_state(0).size(), ids.size() * sizeof(float));
  v1::TableState wide;
  elementwise->Save(&wide);
  EXPECT_EQ(wide.state_width(), 0u) << "a full-width state is saved as before";
  EXPECT_EQ(wide.optimizer_state(0).size(), ids.size() * kWide * sizeof(float));

  // A loaded table goes on exactly as the saved one.
  std::unique_ptr<SparseRows> loaded = Make(true);
  ASSERT_TRUE(loaded->Load(state).ok());
  const std::vector<float> more(ids.size() * kWide, -0.5f);
  rowwise->Apply(GradientRef{more, ids}, kLr);
  loaded->Apply(GradientRef{more, ids}, kLr);
  for (int64_t id : ids)
    for (uint32_t i = 0; i <= kWide; ++i)
      ASSERT_EQ(loaded->TEST_Row(id)[i], rowwise->TEST_Row(id)[i]) << id;

  // A table of the other kind refuses the state, both ways.
  EXPECT_THAT(Make(false)->Load(state).message(), HasSubstr("rowwise_adagrad differs"));
  EXPECT_THAT(Make(true)->Load(wide).message(), HasSubstr("rowwise_adagrad differs"));
  state.set_state_width(3);
  EXPECT_THAT(Make(true)->Load(state).message(), HasSubstr("neither 1 nor 4"));
}

// Issue 43: a row of 16 with row-wise AdaGrad costs at most 1.5 times its
// 64 bytes of values, everything counted (values, state, id, counters,
// index), from 200,000 rows up (below, the last block of 4,096 rows, partly
// filled, weighs more); 419,431 rows is just past a doubling of the index,
// its emptiest.
// An unmanaged table with a limit: CheckRoom decides and creates nothing;
// Read and TakePush create the rows they miss (the store calls CheckRoom
// first, under the same lock), each counted once as traffic.
TEST_F(ManagedRowsTest, CheckRoomDecidesAndReadAndTakePushCreate) {
  v1::SparseTableSpec spec;
  spec.set_name("emb");
  spec.set_dim(kDim);
  spec.set_max_rows_per_shard(4);
  std::unique_ptr<SparseRows> rows = Make(spec);
  ASSERT_TRUE(rows->CheckRoom({1, 2, 2, 3, 3, 4}).ok()) << "4 distinct ids fit 4 rows";
  EXPECT_EQ(rows->size(), 0u) << "CheckRoom creates nothing";
  const absl::Status full = rows->CheckRoom({1, 2, 3, 4, 5});
  EXPECT_EQ(full.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(full.message(), HasSubstr("5 more would pass its limit of 4"));

  std::vector<float> out(3 * kDim);
  rows->Read({1, 2, 1}, out.data());
  EXPECT_EQ(rows->size(), 2u);
  EXPECT_THAT(std::vector<float>(out.begin(), out.begin() + kDim),
              ElementsAreArray(Initial(spec, 1)));
  EXPECT_THAT(std::vector<float>(out.begin() + 2 * kDim, out.end()),
              ElementsAreArray(Initial(spec, 1)));
  rows->TakePush({2, 3});
  EXPECT_EQ(rows->size(), 3u) << "the push's row 3 exists before any update";
  EXPECT_THAT(std::vector<float>(rows->TEST_Row(3), rows->TEST_Row(3) + kDim),
              ElementsAreArray(Initial(spec, 3)));
  const absl::Status past = rows->CheckRoom({4, 5});
  EXPECT_EQ(past.code(), absl::StatusCode::kFailedPrecondition) << "3 held + 2 missing > 4";
  EXPECT_TRUE(rows->CheckRoom({1, 2, 3, 4}).ok());
  // Traffic: pulls of 1, 2, 1 and pushes of 2, 3: row 1 and row 2 each
  // carry 2 of 5, row 3 one; the hottest row (at least one) has 2 of 5.
  EXPECT_NEAR(rows->hottest_share(), 2.0 / 5.0, 1e-9);
}

// In async a push is applied as it is taken (ShardStore::PushSparse):
// Apply with push_taken counts its rows in the walk that updates them, as
// TakePush and then Apply do in two. The same rows, values and traffic,
// managed (capacity, admission) or not.
TEST_F(ManagedRowsTest, AnApplyOfAPushAsItIsTakenCountsItsRowsAsTakePushDoes) {
  v1::SparseTableSpec unmanaged;
  unmanaged.set_name("emb");
  unmanaged.set_dim(kDim);
  for (const v1::SparseTableSpec& spec :
       {unmanaged, Managed(v1::SparseTableSpec::EVICTION_LRU, 12, 2)}) {
    SCOPED_TRACE(spec.ShortDebugString());
    std::unique_ptr<SparseRows> two_walks = Make(spec), one_walk = Make(spec);
    std::vector<float> out(4 * kDim);
    for (int step = 0; step < 40; ++step) {
      std::vector<int64_t> ids = {0, 1, 2};  // 3 hot ids and 5 of 30 cold ones
      for (int k = 0; k < 5; ++k) ids.push_back(10 + (step * 7 + k) % 30);
      const std::vector<float> grad(ids.size() * kDim, 0.25f * (step % 3 + 1));
      const std::vector<int64_t> pulled = {ids[0], 39, ids[0], 7};
      two_walks->Read(pulled, out.data());
      one_walk->Read(pulled, out.data());
      two_walks->TakePush(ids);
      two_walks->Apply(GradientRef{grad, ids}, kLr);
      one_walk->Apply(GradientRef{grad, ids}, kLr, /*push_taken=*/true);
    }
    v1::TableState one, two;
    one_walk->Save(&one);
    two_walks->Save(&two);
    EXPECT_GT(two.ids_size(), 0);
    EXPECT_EQ(one.SerializeAsString(), two.SerializeAsString());
    EXPECT_GT(two_walks->hottest_share(), 0.0);
    EXPECT_EQ(one_walk->hottest_share(), two_walks->hottest_share());
    EXPECT_EQ(one_walk->managed_counts().evicted, two_walks->managed_counts().evicted);
  }
}

TEST(RowwiseAdagradMemory, ARowOf16CostsAtMostOneAndAHalfTimesItsValues) {
  std::unique_ptr<Backend> backend = CreateCpuBackend();
  v1::SparseTableSpec spec;
  spec.set_name("emb");
  spec.set_dim(16);
  spec.set_rowwise_adagrad(true);
  v1::OptimizerConfig opt;
  opt.set_kind(v1::OPTIMIZER_ADAGRAD);
  for (int64_t n : {200000, 419431, 1000000}) {
    SparseRows rows(spec, opt, kSeed, backend.get());
    std::vector<int64_t> ids(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) ids[i] = i * 2 + 1;
    const std::vector<float> grad(ids.size() * 16, 0.5f);
    rows.Apply(GradientRef{grad, ids}, kLr);
    ASSERT_EQ(rows.size(), static_cast<uint64_t>(n));
    const double per_row = static_cast<double>(rows.bytes()) / n;
    std::printf("%lld rows of 16, row-wise AdaGrad: %.1f bytes a row\n", static_cast<long long>(n),
                per_row);
    EXPECT_LE(per_row, 1.5 * 64) << n << " rows";
    EXPECT_GE(per_row, 64 + 4) << n << " rows: values and accumulator at least";
  }
  // Per-element AdaGrad's 64 bytes of state a row, for comparison.
  spec.set_rowwise_adagrad(false);
  SparseRows rows(spec, opt, kSeed, backend.get());
  std::vector<int64_t> ids(1000000);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i);
  rows.Apply(GradientRef{std::vector<float>(ids.size() * 16, 0.5f), ids}, kLr);
  const double per_row = static_cast<double>(rows.bytes()) / ids.size();
  std::printf("1000000 rows of 16, AdaGrad: %.1f bytes a row\n", per_row);
  EXPECT_LE(per_row, 2.5 * 64);
}

TEST(RowwiseAdagradConfig, AnOptionOfTheTableThatNeedsAdagrad) {
  absl::StatusOr<std::vector<v1::SparseTableSpec>> tables =
      ParseSparseTables("a:0:16:rowwise_adagrad=1,b:0:16:rowwise_adagrad=0");
  ASSERT_TRUE(tables.ok()) << tables.status();
  EXPECT_TRUE((*tables)[0].rowwise_adagrad());
  EXPECT_FALSE((*tables)[1].rowwise_adagrad());
  EXPECT_FALSE(ParseSparseTables("a:0:16:rowwise_adagrad=2").ok());
  v1::JobConfig config;
  *config.add_sparse_tables() = (*tables)[0];
  config.mutable_optimizer()->set_kind(v1::OPTIMIZER_ADAM);
  EXPECT_THAT(ValidateSparseTables(config).message(), HasSubstr("needs the adagrad optimizer"));
  config.mutable_optimizer()->set_kind(v1::OPTIMIZER_ADAGRAD);
  EXPECT_TRUE(ValidateSparseTables(config).ok());
}

}  // namespace
}  // namespace grps
