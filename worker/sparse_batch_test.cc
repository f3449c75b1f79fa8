#include "worker/sparse_batch.h"

#include <cctype>
#include <cmath>
#include <cstdint>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "data/sparse_dataset.h"
#include "gtest/gtest.h"

namespace grps {
namespace {

// Owns the storage a SparseExamples views.
struct Csr {
  std::vector<int64_t> offsets;
  std::vector<int64_t> features;
  std::vector<float> values;
  std::vector<int32_t> labels;
  SparseExamples view() const {
    return {offsets, features, values, labels};
  }
};

// Three examples: id 5 twice in the first, id 3 in the first two, one empty.
Csr ThreeExamples() {
  return {{0, 3, 5, 5}, {5, 3, 5, 3, 9}, {1, 2, 3, 4, 5}, {0, 1, 0}};
}

TEST(HashFeatureId, IsTheFeatureItselfInIdentityMode) {
  EXPECT_EQ(HashFeatureId(0, 0), 0u);
  EXPECT_EQ(HashFeatureId(12345, 0), 12345u);
  EXPECT_EQ(HashFeatureId(std::numeric_limits<int64_t>::max(), 0),
            static_cast<uint64_t>(std::numeric_limits<int64_t>::max()));
}

TEST(HashFeatureId, IsPinnedToSplitmix64SoStoredTablesKeepTheirMeaning) {
  // The first output of the reference splitmix64 generator seeded with 0 is
  // the finalizer of 0 + golden gamma; a table of 2^64 - 1 rows keeps it.
  EXPECT_EQ(HashFeatureId(0, std::numeric_limits<uint64_t>::max()),
            0xe220a8397b1dcdafULL);
  EXPECT_EQ(HashFeatureId(0, 1000), 0xe220a8397b1dcdafULL % 1000);
}

TEST(HashFeatureId, IsDeterministicAndInRange) {
  for (uint64_t rows : {1ull, 7ull, 1000ull, 1ull << 40}) {
    for (int64_t f : {int64_t{0}, int64_t{1}, int64_t{-1}, int64_t{42},
                      std::numeric_limits<int64_t>::min(),
                      std::numeric_limits<int64_t>::max()}) {
      const uint64_t id = HashFeatureId(f, rows);
      EXPECT_LT(id, rows) << "feature " << f << " rows " << rows;
      EXPECT_EQ(HashFeatureId(f, rows), id);
    }
  }
}

TEST(HashFeatureId, SpreadsConsecutiveFeaturesEvenlyOverTheTable) {
  // 100000 consecutive features into 100 rows: 1000 expected per row. A
  // uniform hash gives a chi-square statistic near 99 (sd 14); identity
  // mod 100 would give 0 and a poor mix hundreds or more.
  const uint64_t rows = 100;
  std::vector<int> count(rows, 0);
  for (int64_t f = 0; f < 100000; ++f) ++count[HashFeatureId(f, rows)];
  double chi2 = 0;
  for (int c : count) chi2 += (c - 1000.0) * (c - 1000.0) / 1000.0;
  EXPECT_GT(chi2, 50);
  EXPECT_LT(chi2, 160);
  // And nearby features do not land on nearby rows.
  int adjacent = 0;
  for (int64_t f = 0; f < 1000; ++f) {
    const int64_t a = static_cast<int64_t>(HashFeatureId(f, 1 << 20));
    const int64_t b = static_cast<int64_t>(HashFeatureId(f + 1, 1 << 20));
    if (std::abs(a - b) < 1024) ++adjacent;
  }
  EXPECT_LT(adjacent, 10);  // ~2 expected by chance
}

TEST(SparseBatch, RepeatedIdsWithinAndAcrossExamplesGiveOneUniqueId) {
  const Csr csr = ThreeExamples();
  auto batch = SparseBatch::Create(csr.view(), /*table_rows=*/0);
  ASSERT_TRUE(batch.ok()) << batch.status();
  EXPECT_EQ(batch->size(), 3);
  EXPECT_EQ(batch->nnz(), 5);
  EXPECT_EQ(batch->unique_ids(), (std::vector<int64_t>{3, 5, 9}));
  EXPECT_EQ(batch->rows(), (std::vector<int32_t>{1, 0, 1, 0, 2}));
  EXPECT_EQ(batch->values(), csr.values);
  EXPECT_EQ(batch->offsets(), csr.offsets);
  EXPECT_EQ(batch->labels(), csr.labels);
}

TEST(SparseBatch, RowsMapEveryNonzeroBackToItsHashedId) {
  Csr csr;
  csr.offsets = {0};
  for (int i = 0; i < 20; ++i) {
    for (int k = 0; k < 1 + i % 4; ++k) {
      csr.features.push_back((i * 7919 + k * 104729) % 37 - 10);  // repeats
      csr.values.push_back(0.5f * k);
    }
    csr.offsets.push_back(static_cast<int64_t>(csr.features.size()));
    csr.labels.push_back(i % 3);
  }
  const uint64_t table_rows = 1000;
  auto batch = SparseBatch::Create(csr.view(), table_rows);
  ASSERT_TRUE(batch.ok()) << batch.status();
  const std::vector<int64_t>& ids = batch->unique_ids();
  std::set<int64_t> expected;
  for (int64_t f : csr.features) expected.insert(HashFeatureId(f, table_rows));
  EXPECT_EQ(ids, std::vector<int64_t>(expected.begin(), expected.end()));
  ASSERT_EQ(batch->rows().size(), csr.features.size());
  ASSERT_LT(ids.size(), csr.features.size());  // the test has repeats
  for (size_t j = 0; j < csr.features.size(); ++j) {
    EXPECT_EQ(ids[batch->rows()[j]],
              static_cast<int64_t>(HashFeatureId(csr.features[j], table_rows)))
        << "nonzero " << j;
  }
}

TEST(SparseBatch, AnEmptyBatchHasNoIds) {
  const Csr csr = {{0}, {}, {}, {}};
  auto batch = SparseBatch::Create(csr.view(), 100);
  ASSERT_TRUE(batch.ok()) << batch.status();
  EXPECT_EQ(batch->size(), 0);
  EXPECT_TRUE(batch->unique_ids().empty());
  EXPECT_EQ(batch->offsets(), (std::vector<int64_t>{0}));
}

TEST(SparseBatch, BuildReplacesThePreviousContents) {
  SparseBatch batch;
  ASSERT_TRUE(batch.Build(ThreeExamples().view(), 0).ok());
  const Csr second = {{0, 1}, {4}, {2.0f}, {1}};
  ASSERT_TRUE(batch.Build(second.view(), 0).ok());
  EXPECT_EQ(batch.size(), 1);
  EXPECT_EQ(batch.unique_ids(), (std::vector<int64_t>{4}));
  EXPECT_EQ(batch.rows(), (std::vector<int32_t>{0}));
  EXPECT_EQ(batch.values(), (std::vector<float>{2.0f}));
  EXPECT_EQ(batch.offsets(), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(batch.labels(), (std::vector<int32_t>{1}));
}

TEST(SparseBatch, AFailedBuildLeavesAnEmptyBatch) {
  SparseBatch batch;
  ASSERT_TRUE(batch.Build(ThreeExamples().view(), 0).ok());
  Csr bad = ThreeExamples();
  bad.values[0] = std::nanf("");
  EXPECT_EQ(batch.Build(bad.view(), 0).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(batch.size(), 0);
  EXPECT_EQ(batch.nnz(), 0);
  EXPECT_TRUE(batch.unique_ids().empty());
  EXPECT_EQ(batch.offsets(), (std::vector<int64_t>{0}));
}

// Each case breaks one invariant of ThreeExamples.
struct BadInput {
  const char* what;
  void (*mutate)(Csr&);
  uint64_t table_rows;
  int32_t fields = 1;
};

class SparseBatchRejects : public testing::TestWithParam<BadInput> {};

TEST_P(SparseBatchRejects, WithInvalidArgument) {
  Csr csr = ThreeExamples();
  GetParam().mutate(csr);
  auto batch = SparseBatch::Create(csr.view(), GetParam().table_rows, GetParam().fields);
  EXPECT_EQ(batch.status().code(), absl::StatusCode::kInvalidArgument)
      << GetParam().what << ": " << batch.status();
}

INSTANTIATE_TEST_SUITE_P(
    SparseBatch, SparseBatchRejects,
    testing::Values(
        BadInput{"one offset too few", [](Csr& c) { c.offsets.pop_back(); }, 0},
        BadInput{"one offset too many", [](Csr& c) { c.offsets.push_back(5); }, 0},
        BadInput{"no offsets at all", [](Csr& c) { c.offsets.clear(); }, 0},
        BadInput{"offsets not starting at 0", [](Csr& c) { c.offsets[0] = 1; }, 0},
        BadInput{"offsets ending short of the features",
                 [](Csr& c) {
                   c.offsets = {0, 3, 4, 4};
                 },
                 0},
        BadInput{"offsets decreasing",
                 [](Csr& c) {
                   c.offsets = {0, 3, 2, 5};
                 },
                 0},
        BadInput{"fewer values than features", [](Csr& c) { c.values.pop_back(); }, 0},
        BadInput{"a NaN value", [](Csr& c) { c.values[2] = std::nanf(""); }, 0},
        BadInput{"an infinite value",
                 [](Csr& c) { c.values[4] = -std::numeric_limits<float>::infinity(); }, 1000},
        BadInput{"a negative feature in identity mode", [](Csr& c) { c.features[1] = -3; }, 0},
        BadInput{"a table too large for int64 ids", [](Csr&) {}, uint64_t{1} << 63},
        BadInput{"no fields", [](Csr&) {}, 0, 0},
        BadInput{"a feature of a field past the last",
                 [](Csr& c) { c.features[2] = FieldFeature(3, 7); }, 0, 3},
        BadInput{"a negative feature with several fields", [](Csr& c) { c.features[1] = -3; }, 1000,
                 3}),
    [](const testing::TestParamInfo<BadInput>& info) {
      std::string name = info.param.what;
      for (char& ch : name) {
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
      }
      return name;
    });

TEST(SparseBatch, NegativeFeaturesAreFineWhenHashed) {
  Csr csr = ThreeExamples();
  csr.features[1] = -3;
  auto batch = SparseBatch::Create(csr.view(), 1000);
  ASSERT_TRUE(batch.ok()) << batch.status();
  EXPECT_EQ(batch->unique_ids()[batch->rows()[1]],
            static_cast<int64_t>(HashFeatureId(-3, 1000)));
}

// Three fields, each its own table: the same raw id in two fields is two
// rows, one in each table's part of unique_ids(); every table's ids are
// sorted and distinct; each nonzero knows its field.
TEST(SparseBatch, SeveralFieldsGiveEachTableItsOwnSortedIds) {
  auto f = [](int32_t field, int64_t id) { return FieldFeature(field, id); };
  Csr csr{{0, 4, 6, 6},
          {f(0, 9), f(0, 4), f(2, 9), f(2, 9), f(0, 4), f(2, 1)},
          {1, 2, 3, 4, 5, 6},
          {0, 1, 0}};
  auto batch = SparseBatch::Create(csr.view(), 0, 3);
  ASSERT_TRUE(batch.ok()) << batch.status();
  EXPECT_EQ(batch->num_fields(), 3);
  EXPECT_EQ(batch->unique_ids(), (std::vector<int64_t>{4, 9, 1, 9}));
  EXPECT_EQ(batch->table_offsets(), (std::vector<int64_t>{0, 2, 2, 4}));
  EXPECT_TRUE(batch->table_ids(1).empty());
  EXPECT_EQ(std::vector<int64_t>(batch->table_ids(2).begin(), batch->table_ids(2).end()),
            (std::vector<int64_t>{1, 9}));
  EXPECT_EQ(batch->rows(), (std::vector<int32_t>{1, 0, 3, 3, 0, 2}));
  EXPECT_EQ(batch->fields(), (std::vector<int32_t>{0, 0, 2, 2, 0, 2}));
  // Hashed, each field's raw id is hashed on its own (not its tagged id).
  batch = SparseBatch::Create(csr.view(), 1000, 3);
  ASSERT_TRUE(batch.ok()) << batch.status();
  EXPECT_EQ(batch->unique_ids()[batch->rows()[2]], static_cast<int64_t>(HashFeatureId(9, 1000)));
  EXPECT_EQ(batch->fields()[2], 2);
  // One field reads a tagged id as a raw id: one table of all of them.
  batch = SparseBatch::Create(csr.view(), 0);
  ASSERT_TRUE(batch.ok()) << batch.status();
  EXPECT_EQ(batch->table_offsets(), (std::vector<int64_t>{0, 4}));
}

}  // namespace
}  // namespace grps
