// The store's targets (server/store_targets.h): a chunk's update, version,
// counters, capture and reset; a table's; the lock order.
#include "server/store_targets.h"

#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/testing/policy_test_target.h"
#include "tensor/backend.h"

namespace grps {
namespace {

using ::testing::ElementsAre;

v1::JobConfig Config(v1::ConsistencyMode mode = v1::MODE_ASYNC) {
  return PolicyTestConfig(mode, 1);
}

std::vector<float> ValuesOf(StoreChunk& c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(c.mu) {
  return std::vector<float>(c.values.f32(), c.values.f32() + c.num_elements());
}

TEST(StoreChunk, AnUpdateRunsTheOptimizerAndAddsOneToTheVersionAndTheCounters) {
  const v1::JobConfig config = Config();
  StoreChunk chunk(3, 2, CreateCpuBackend(), config);
  absl::MutexLock lock(&chunk.mu);
  chunk.values.f32()[0] = 1;
  chunk.values.f32()[1] = 2;
  const std::vector<float> g = {1, 4};
  chunk.Apply(Grad(g), UpdateStep{0.5f}, /*staleness=*/20);
  EXPECT_THAT(ValuesOf(chunk), ElementsAre(0.5f, 0.0f));
  EXPECT_EQ(chunk.version(), 1u);
  EXPECT_EQ(chunk.counters.updates, 1u);
  EXPECT_EQ(chunk.counters.staleness_max, 20u);
  EXPECT_EQ(chunk.counters.staleness_histogram[kStalenessBuckets - 1], 1u);
  chunk.Apply(Grad(g), UpdateStep{0.5f}, /*staleness=*/-1);  // not measured
  EXPECT_EQ(chunk.counters.staleness_count, 1u);
  EXPECT_EQ(chunk.name, "chunk 3");
}

TEST(StoreChunk, AnUpdateThatNamesTheProgramsOptimizerRunsItsHyperparametersOnTheJobsState) {
  v1::JobConfig config = Config();
  config.mutable_optimizer()->set_kind(v1::OPTIMIZER_MOMENTUM);
  config.mutable_optimizer()->set_momentum(0.9f);
  StoreChunk chunk(0, 1, CreateCpuBackend(), config);
  absl::MutexLock lock(&chunk.mu);
  chunk.values.f32()[0] = 1;
  v1::OptimizerConfig program;  // a param group of torch's SGD(nesterov=True)
  program.set_kind(v1::OPTIMIZER_NESTEROV);
  program.set_learning_rate(0.5f);
  program.set_momentum(0.5f);
  const std::vector<float> g = {1};
  chunk.Apply(Grad(g), UpdateStep{0.5f, &program}, -1);  // v = 1; p -= 0.5 (1 + 0.5)
  EXPECT_THAT(ValuesOf(chunk), ElementsAre(0.25f));
  chunk.Apply(Grad(g), UpdateStep{1.0f}, -1);  // the job's: v = 0.9 + 1; p -= 1.9
  EXPECT_THAT(ValuesOf(chunk), ElementsAre(0.25f - 1.9f));
}

TEST(StoreChunk, AnArmedCaptureIsTakenInsideTheUpdateThatReachesItsVersion) {
  const v1::JobConfig config = Config();
  StoreChunk chunk(0, 1, CreateCpuBackend(), config);
  absl::MutexLock lock(&chunk.mu);
  chunk.values.f32()[0] = 0;
  chunk.capture_at = 2;
  const std::vector<float> g = {-1};
  chunk.Apply(Grad(g), UpdateStep{1.0f}, -1);
  EXPECT_FALSE(chunk.captured.has_value());
  chunk.Apply(Grad(g), UpdateStep{1.0f}, -1);
  chunk.Apply(Grad(g), UpdateStep{1.0f}, -1);
  v1::ShardCheckpointFile file;
  ASSERT_TRUE(chunk.TakeCapture(&file));
  ASSERT_EQ(file.chunks_size(), 1);
  EXPECT_EQ(file.chunks(0).version(), 2u);
  float value;
  std::memcpy(&value, file.chunks(0).values().data(), sizeof value);
  EXPECT_EQ(value, 2.0f);
  EXPECT_FALSE(chunk.TakeCapture(&file)) << "taken once";
}

TEST(StoreChunk, ResetGoesBackToAStateOrToTheInitialValues) {
  const v1::JobConfig config = Config();
  v1::ChunkSpec spec;
  spec.set_chunk_id(0);
  spec.set_num_elements(2);
  v1::TensorSpec tensor;
  tensor.set_name("t");
  tensor.add_shape(2);
  tensor.set_initializer("zeros");
  StoreChunk chunk(0, 2, CreateCpuBackend(), config);
  absl::MutexLock lock(&chunk.mu);
  v1::ChunkState state;
  state.set_chunk_id(0);
  state.set_version(7);
  state.set_num_elements(2);
  const float values[] = {3, 4};
  state.set_values(reinterpret_cast<const char*>(values), sizeof values);
  v1::DedupMark* mark = state.add_marks();
  mark->set_valid(true);
  mark->set_incarnation(2);
  mark->set_step(6);
  ASSERT_TRUE(chunk.Reset(&state, spec, tensor, config, {}).ok());
  EXPECT_EQ(chunk.version(), 7u);
  EXPECT_THAT(ValuesOf(chunk), ElementsAre(3.0f, 4.0f));
  EXPECT_TRUE(chunk.marks[0].valid);
  EXPECT_EQ(chunk.marks[0].step, 6u);
  ASSERT_TRUE(chunk.Reset(nullptr, spec, tensor, config, {}).ok());
  EXPECT_EQ(chunk.version(), 0u);
  EXPECT_THAT(ValuesOf(chunk), ElementsAre(0.0f, 0.0f));
  EXPECT_FALSE(chunk.marks[0].valid);
}

TEST(StoreTable, AnUpdateCreatesNoRowsAndAResetDropsThem) {
  v1::JobConfig config = Config();
  v1::SparseTableSpec* spec = config.add_sparse_tables();
  spec->set_name("emb");
  spec->set_dim(2);
  spec->set_rows(100);
  StoreTable table(0, config.sparse_tables(0), CreateCpuBackend(), config);
  absl::MutexLock lock(&table.mu);
  const int64_t ids[] = {7};
  ASSERT_TRUE(table.rows->Ensure(ids).ok());
  const std::vector<float> g = {1, 1};
  table.Apply(GradientRef{g, ids}, UpdateStep{1.0f}, -1);
  EXPECT_EQ(table.version(), 1u);
  EXPECT_EQ(table.rows->size(), 1u);
  EXPECT_EQ(table.name, "table 'emb'");
  table.Reset(nullptr, nullptr, config, {});
  EXPECT_EQ(table.version(), 0u);
  EXPECT_EQ(table.rows->size(), 0u);
}

TEST(TargetLocks, TwoHoldersNamingTheSameTargetsInOtherOrdersNeverDeadlock) {
  const v1::JobConfig config = Config();
  StoreChunk a(0, 1, CreateCpuBackend(), config);
  StoreChunk b(1, 1, CreateCpuBackend(), config);
  auto hammer = [](std::vector<StoreTarget*> targets) {
    for (int i = 0; i < 2000; ++i) TargetLocks locks(targets);
  };
  std::thread forward(hammer, std::vector<StoreTarget*>{&a, &b});
  std::thread backward(hammer, std::vector<StoreTarget*>{&b, &a});
  forward.join();
  backward.join();
  // Both released: a plain lock succeeds.
  bool free = false;
  if (a.mu.TryLock()) {
    free = true;
    a.mu.Unlock();
  }
  EXPECT_TRUE(free);
}

}  // namespace
}  // namespace grps
