// The status part of the store (server/shard_status.h): counters, and how
// the targets add up to a ShardStatus.
#include "server/shard_status.h"

#include <memory>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/testing/policy_test_target.h"
#include "server/store_targets.h"
#include "tensor/backend.h"

namespace grps {
namespace {

using ::testing::ElementsAre;

TEST(TargetCounters, AddSumsEveryCounterAndKeepsTheLargestStaleness) {
  TargetCounters a, b;
  a.pushes = 2;
  a.CountStaleness(1);
  a.late_by_worker = {1};
  b.pushes = 3;
  b.CountStaleness(40);
  b.late_by_worker = {0, 2};
  a.Add(b);
  EXPECT_EQ(a.pushes, 5u);
  EXPECT_EQ(a.staleness_count, 2u);
  EXPECT_EQ(a.staleness_sum, 41u);
  EXPECT_EQ(a.staleness_max, 40u);
  EXPECT_EQ(a.staleness_histogram[1], 1u);
  EXPECT_EQ(a.staleness_histogram[kStalenessBuckets - 1], 1u);
  EXPECT_THAT(a.late_by_worker, ElementsAre(1u, 2u));
}

TEST(AddTargetsStatus, TheShardReportsItsSlowestChunkAndTheSumsOfItsTargets) {
  v1::JobConfig config = PolicyTestConfig(v1::MODE_ASYNC, 2);
  v1::SparseTableSpec* spec = config.add_sparse_tables();
  spec->set_name("emb");
  spec->set_dim(2);
  std::vector<std::unique_ptr<StoreChunk>> chunks;
  for (uint32_t id = 0; id < 2; ++id)
    chunks.push_back(std::make_unique<StoreChunk>(id, 3, CreateCpuBackend(), config));
  std::vector<std::unique_ptr<StoreTable>> tables;
  tables.push_back(std::make_unique<StoreTable>(0, *spec, CreateCpuBackend(), config));
  const std::vector<float> g(3, 0.0f);
  {
    absl::MutexLock lock(&chunks[1]->mu);
    chunks[1]->Apply(Grad(g), UpdateStep{1.0f}, 2);
    chunks[1]->Apply(Grad(g), UpdateStep{1.0f}, 4);
    chunks[1]->counters.pushes = 2;
  }
  {
    absl::MutexLock lock(&tables[0]->mu);
    const int64_t ids[] = {5};
    ASSERT_TRUE(tables[0]->rows->Ensure(ids).ok());
    tables[0]->counters.pushes = 1;
    tables[0]->rows_pushed = 1;
  }
  v1::ShardStatus status;
  AddTargetsStatus(chunks, tables, &status);
  EXPECT_EQ(status.num_chunks(), 2u);
  EXPECT_EQ(status.num_elements(), 6u);
  EXPECT_EQ(status.version(), 0u) << "the slowest chunk";
  EXPECT_EQ(status.updates_applied(), 2u);
  EXPECT_EQ(status.pushes(), 3u);
  EXPECT_DOUBLE_EQ(status.staleness_mean(), 3.0);
  EXPECT_EQ(status.staleness_max(), 4u);
  ASSERT_EQ(status.tables_size(), 1);
  EXPECT_EQ(status.tables(0).name(), "emb");
  EXPECT_EQ(status.tables(0).rows(), 1u);
  EXPECT_EQ(status.tables(0).rows_pushed(), 1u);
  EXPECT_EQ(status.late_by_worker_size(), 2);
}

TEST(AddTargetsStatus, AShardWithoutChunksIsAtVersionZero) {
  v1::ShardStatus status;
  AddTargetsStatus({}, {}, &status);
  EXPECT_EQ(status.version(), 0u);
  EXPECT_EQ(status.num_chunks(), 0u);
}

}  // namespace
}  // namespace grps
