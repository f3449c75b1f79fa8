// Sparse tables on a shard: rows created on first use, row-wise optimizers,
// the consistency modes applied to rows as to chunks, exactly-once pushes,
// the row limit, the network edge's refusals, each changing nothing, and
// checkpoints of the rows restored into any number of shards.

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/checkpoint.h"
#include "daemon/daemon.h"
#include "daemon/env.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "job/job_config.h"
#include "job/shard_map.h"
#include "job/sparse_tables.h"
#include "proto/grps.grpc.pb.h"
#include "server/parameter_server_service.h"
#include "server/request_checks.h"
#include "server/served_rows.h"
#include "server/shard_checkpointer.h"
#include "server/shard_store.h"
#include "spdlog/spdlog.h"
#include "tensor/dtype.h"
#include "test/temp_folders.h"

namespace grps {
namespace {

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::Pointwise;
using ::testing::FloatNear;

constexpr uint32_t kDim = 4;
constexpr float kLr = 0.5f;

std::string F32Bytes(const std::vector<float>& values) {
  std::string bytes(values.size() * sizeof(float), '\0');
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

std::vector<float> FromF32Bytes(const std::string& bytes) {
  std::vector<float> values(bytes.size() / sizeof(float));
  std::memcpy(values.data(), bytes.data(), values.size() * sizeof(float));
  return values;
}

// A job of 2 servers and 2 workers with one table "emb" (dim 4, ids below
// 1000) and a small dense model; this process holds shard 0.
v1::JobConfig SparseJob(v1::ConsistencyMode mode, v1::OptimizerKind optimizer,
                        uint64_t max_rows = 0) {
  v1::JobConfig config = DefaultJobConfig();
  config.set_job_id("sparse-job");
  config.set_mode(mode);
  config.set_num_workers(2);
  config.set_num_servers(2);
  // A small dense model beside the table: Restore holds every target's lock
  // at once, and ThreadSanitizer's deadlock detector tracks at most 64 held.
  config.set_model(v1::MODEL_SOFTMAX);
  config.clear_hidden_units();
  config.set_input_features(8);
  config.set_num_classes(2);
  config.set_chunk_bytes(1024);
  config.mutable_optimizer()->set_kind(optimizer);
  config.mutable_optimizer()->set_learning_rate(kLr);
  config.mutable_optimizer()->set_momentum(optimizer == v1::OPTIMIZER_MOMENTUM ? 0.9f : 0.0f);
  config.mutable_optimizer()->set_decay_steps(0);
  v1::SparseTableSpec* table = config.add_sparse_tables();
  table->set_name("emb");
  table->set_dim(kDim);
  table->set_rows(1000);
  table->set_max_rows_per_shard(max_rows);
  return config;
}

// The first `n` ids of [0, 1000) that hash to `shard` of 2.
std::vector<int64_t> IdsOf(uint32_t shard, size_t n) {
  std::vector<int64_t> ids;
  for (int64_t id = 0; id < 1000 && ids.size() < n; ++id)
    if (SparseShardOf(id, 2) == shard) ids.push_back(id);
  return ids;
}

std::vector<float> InitialRow(const v1::JobConfig& config, int64_t id) {
  std::vector<float> row(kDim);
  InitializeSparseRow(config.sparse_tables(0), config.seed(), id, row.data());
  return row;
}

v1::ShardMap MapOf(const v1::JobConfig& config) {
  absl::StatusOr<v1::ShardMap> map =
      BuildShardMap(ModelTensors(config), config.num_servers(), config.chunk_bytes());
  EXPECT_TRUE(map.ok()) << map.status();
  return map.ok() ? *map : v1::ShardMap();
}

// Shard `shard` of the job; restored from checkpoint 1 (generation 1) when
// `restore` is given.
std::unique_ptr<ShardStore> MakeStore(const v1::JobConfig& config, uint32_t shard = 0,
                                      ShardState* restore = nullptr) {
  ShardStore::Options options;
  options.config = config;
  options.shard_map = MapOf(config);
  options.shard = shard;
  options.incarnation = 1;
  if (restore != nullptr) {
    options.generation = 1;
    options.restored_checkpoint = 1;
    options.restore = std::move(restore->chunks);
    options.restore_tables = std::move(restore->tables);
  }
  absl::StatusOr<std::unique_ptr<ShardStore>> store = ShardStore::Create(std::move(options));
  EXPECT_TRUE(store.ok()) << store.status();
  return store.ok() ? std::move(*store) : nullptr;
}

ShardStore::SparseGradientPush Gradient(uint32_t rank, uint64_t step, uint64_t base_version,
                                        const std::vector<int64_t>& ids,
                                        const std::vector<float>& values) {
  ShardStore::SparseGradientPush push;
  push.worker_rank = rank;
  push.incarnation = 1;
  push.step = step;
  push.table = "emb";
  push.base_version = base_version;
  push.ids = ids;
  push.values = values;
  return push;
}

absl::StatusOr<ShardStore::PulledRows> PullRows(ShardStore& store, const std::vector<int64_t>& ids,
                                                std::optional<uint64_t> clock = std::nullopt,
                                                uint32_t rank = 0,
                                                absl::Duration wait = absl::ZeroDuration()) {
  ShardStore::SparsePullSpec spec;
  spec.worker_rank = rank;
  spec.table = "emb";
  spec.ids = ids;
  spec.clock = clock;
  spec.deadline = absl::Now() + wait;
  return store.PullSparse(std::move(spec));
}

const v1::SparseTableStatus& TableStatus(const v1::ShardStatus& status) {
  return status.tables(0);
}

TEST(SparseTable, RowsAreCreatedOnFirstPullFromTheDeterministicInitializer) {
  const v1::JobConfig config = SparseJob(v1::MODE_ASYNC, v1::OPTIMIZER_SGD);
  std::unique_ptr<ShardStore> store = MakeStore(config);
  const std::vector<int64_t> ids = IdsOf(0, 3);
  EXPECT_EQ(TableStatus(store->ShardStatus()).rows(), 0u);
  absl::StatusOr<ShardStore::PulledRows> rows = PullRows(*store, {ids[0], ids[1], ids[0]});
  ASSERT_TRUE(rows.ok()) << rows.status();
  const std::vector<float> got = FromF32Bytes(rows->data);
  ASSERT_EQ(got.size(), 3 * kDim);
  const std::vector<float> first = InitialRow(config, ids[0]);
  EXPECT_THAT(std::vector<float>(got.begin(), got.begin() + kDim), ElementsAreArray(first));
  EXPECT_THAT(std::vector<float>(got.begin() + 2 * kDim, got.end()), ElementsAreArray(first));
  EXPECT_NE(InitialRow(config, ids[0]), InitialRow(config, ids[1]));
  for (float v : got) EXPECT_LE(std::fabs(v), SparseInitScale(config.sparse_tables(0)));
  const v1::SparseTableStatus table = TableStatus(store->ShardStatus());
  EXPECT_EQ(table.rows(), 2u);  // the repeated id is one row
  EXPECT_EQ(table.rows_pulled(), 3u);
  EXPECT_GT(table.bytes_per_row(), kDim * sizeof(float));
}

TEST(SparseTable, AsyncAppliesEachPushToItsRowsOnlyAndCountsStaleness) {
  const v1::JobConfig config = SparseJob(v1::MODE_ASYNC, v1::OPTIMIZER_SGD);
  std::unique_ptr<ShardStore> store = MakeStore(config);
  const std::vector<int64_t> ids = IdsOf(0, 2);
  ASSERT_TRUE(PullRows(*store, ids).ok());
  const std::vector<float> grad(kDim, 1.0f);
  absl::StatusOr<ShardStore::SparsePushResult> r =
      store->PushSparse(Gradient(0, 0, 0, {ids[0]}, grad));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->version, 1u);
  // Async: lr / num_workers per update, computed on version 0 (staleness 0).
  std::vector<float> want = InitialRow(config, ids[0]);
  for (float& v : want) v -= kLr / 2 * 1.0f;
  EXPECT_THAT(*store->TEST_ReadRow("emb", ids[0]), Pointwise(FloatNear(1e-6), want));
  EXPECT_THAT(*store->TEST_ReadRow("emb", ids[1]), ElementsAreArray(InitialRow(config, ids[1])));
  // Rank 1's gradient was computed on version 0 too: staleness 1.
  ASSERT_TRUE(store->PushSparse(Gradient(1, 0, 0, {ids[0]}, grad)).ok());
  const v1::ShardStatus status = store->ShardStatus();
  EXPECT_EQ(TableStatus(status).version(), 2u);
  EXPECT_EQ(status.staleness_max(), 1u);
  EXPECT_EQ(TableStatus(status).rows_pushed(), 2u);
}

TEST(SparseTable, SyncAveragesTheStepsRowsOnceEveryWorkerPushedAndPullsWait) {
  const v1::JobConfig config = SparseJob(v1::MODE_SYNC, v1::OPTIMIZER_SGD);
  std::unique_ptr<ShardStore> store = MakeStore(config);
  const std::vector<int64_t> ids = IdsOf(0, 3);
  // Rank 0 touches rows a and b, rank 1 rows b and c.
  ASSERT_TRUE(store->PushSparse(Gradient(0, 0, 0, {ids[0], ids[1]},
                                         {1, 1, 1, 1, 2, 2, 2, 2})).ok());
  // Rank 0's pull at its next clock waits for the step.
  absl::StatusOr<ShardStore::PulledRows> early = PullRows(*store, {ids[1]}, 1, 0);
  EXPECT_EQ(early.status().code(), absl::StatusCode::kDeadlineExceeded) << early.status();
  EXPECT_THAT(early.status().message(), HasSubstr("table 'emb'"));
  std::thread pusher([&] {
    // Once the pull waits (a pull that came after the push would not).
    const absl::Time give_up = absl::Now() + absl::Seconds(10);
    while (store->waiting_pulls() == 0 && absl::Now() < give_up)
      absl::SleepFor(absl::Milliseconds(1));
    EXPECT_EQ(store->waiting_pulls(), 1u);
    EXPECT_TRUE(store->PushSparse(Gradient(1, 0, 0, {ids[1], ids[2]},
                                           {4, 4, 4, 4, 8, 8, 8, 8})).ok());
  });
  absl::StatusOr<ShardStore::PulledRows> pulled =
      PullRows(*store, {ids[0], ids[1], ids[2]}, 1, 0, absl::Seconds(10));
  pusher.join();
  ASSERT_TRUE(pulled.ok()) << pulled.status();
  EXPECT_EQ(pulled->version, 1u);
  // One update with the average of the two workers' gradients (sum / 2).
  const float step_grad[3] = {0.5f, 3.0f, 4.0f};
  const std::vector<float> got = FromF32Bytes(pulled->data);
  for (int r = 0; r < 3; ++r) {
    const std::vector<float> init = InitialRow(config, ids[r]);
    for (uint32_t k = 0; k < kDim; ++k)
      EXPECT_NEAR(got[r * kDim + k], init[k] - kLr * step_grad[r], 1e-6) << "row " << r;
  }
  EXPECT_EQ(store->ShardStatus().updates_applied(), 1u);
}

TEST(SparseTable, SyncStepCompletesWithAPushThatTouchesNoRows) {
  const v1::JobConfig config = SparseJob(v1::MODE_SYNC, v1::OPTIMIZER_SGD);
  std::unique_ptr<ShardStore> store = MakeStore(config);
  const std::vector<int64_t> ids = IdsOf(0, 1);
  ASSERT_TRUE(store->PushSparse(Gradient(0, 0, 0, ids, std::vector<float>(kDim, 1.0f))).ok());
  ASSERT_TRUE(store->PushSparse(Gradient(1, 0, 0, {}, {})).ok());
  EXPECT_EQ(TableStatus(store->ShardStatus()).version(), 1u);
  std::vector<float> want = InitialRow(config, ids[0]);
  for (float& v : want) v -= kLr * 0.5f;
  EXPECT_THAT(*store->TEST_ReadRow("emb", ids[0]), Pointwise(FloatNear(1e-6), want));
}

TEST(SparseTable, ARetriedPushIsAppliedExactlyOnce) {
  for (v1::ConsistencyMode mode : {v1::MODE_SYNC, v1::MODE_ASYNC, v1::MODE_SSP}) {
    SCOPED_TRACE(ModeName(mode));
    const v1::JobConfig config = SparseJob(mode, v1::OPTIMIZER_SGD);
    std::unique_ptr<ShardStore> store = MakeStore(config);
    const std::vector<int64_t> ids = IdsOf(0, 1);
    const std::vector<float> grad(kDim, 1.0f);
    for (uint32_t rank : {0u, 1u}) {
      ASSERT_TRUE(store->PushSparse(Gradient(rank, 0, 0, ids, grad)).ok());
      // The retry of the same (incarnation, step): acknowledged, not applied.
      absl::StatusOr<ShardStore::SparsePushResult> retry =
          store->PushSparse(Gradient(rank, 0, 0, ids, grad));
      ASSERT_TRUE(retry.ok()) << retry.status();
      EXPECT_TRUE(retry->duplicate);
    }
    const v1::ShardStatus status = store->ShardStatus();
    EXPECT_EQ(status.duplicate_pushes(), 2u);
    // Sync: one step of the average; async and ssp: two updates at lr / 2.
    std::vector<float> want = InitialRow(config, ids[0]);
    for (float& v : want) v -= kLr * 1.0f;
    EXPECT_THAT(*store->TEST_ReadRow("emb", ids[0]), Pointwise(FloatNear(1e-6), want));
  }
}

TEST(SparseTable, AdamIsLazyAndCountsEachRowsOwnUpdates) {
  v1::JobConfig config = SparseJob(v1::MODE_ASYNC, v1::OPTIMIZER_ADAM);
  config.mutable_optimizer()->set_beta1(0.9f);
  config.mutable_optimizer()->set_beta2(0.999f);
  config.mutable_optimizer()->set_epsilon(1e-8f);
  config.set_num_workers(1);
  std::unique_ptr<ShardStore> store = MakeStore(config);
  const std::vector<int64_t> ids = IdsOf(0, 2);
  ASSERT_TRUE(PullRows(*store, ids).ok());
  // Three updates of row a, then the first of row b: row b's first Adam step
  // is bias-corrected as t = 1 (a step of lr * sign(g)), not as t = 4.
  for (uint64_t step = 0; step < 3; ++step)
    ASSERT_TRUE(store->PushSparse(Gradient(0, step, step, {ids[0]}, std::vector<float>(kDim, 1.0f))).ok());
  ASSERT_TRUE(store->PushSparse(Gradient(0, 3, 3, {ids[1]}, std::vector<float>(kDim, 2.0f))).ok());
  std::vector<float> want = InitialRow(config, ids[1]);
  for (float& v : want) v -= kLr;  // async lr / 1 worker; m̂ / sqrt(v̂) = 1
  EXPECT_THAT(*store->TEST_ReadRow("emb", ids[1]), Pointwise(FloatNear(1e-5), want));
}

TEST(SparseTable, TheRowLimitRefusesAPullOrPushThatWouldPassItAndCreatesNothing) {
  const v1::JobConfig config = SparseJob(v1::MODE_ASYNC, v1::OPTIMIZER_SGD, /*max_rows=*/2);
  std::unique_ptr<ShardStore> store = MakeStore(config);
  const std::vector<int64_t> ids = IdsOf(0, 3);
  ASSERT_TRUE(PullRows(*store, {ids[0]}).ok());
  absl::StatusOr<ShardStore::PulledRows> over = PullRows(*store, {ids[1], ids[2]});
  EXPECT_EQ(over.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(over.status().message(), HasSubstr("max_rows_per_shard"));
  EXPECT_EQ(TableStatus(store->ShardStatus()).rows(), 1u);
  absl::StatusOr<ShardStore::SparsePushResult> push = store->PushSparse(
      Gradient(0, 0, 0, {ids[1], ids[2]}, std::vector<float>(2 * kDim, 1.0f)));
  EXPECT_EQ(push.status().code(), absl::StatusCode::kFailedPrecondition);
  const v1::ShardStatus status = store->ShardStatus();
  EXPECT_EQ(TableStatus(status).rows(), 1u);
  EXPECT_EQ(TableStatus(status).version(), 0u);
  EXPECT_EQ(status.rejected_pushes(), 1u);
  // Within the limit both still work.
  EXPECT_TRUE(PullRows(*store, {ids[0], ids[1]}).ok());
}

TEST(SparseTable, AManagedTablePastItsCapacityEvictsWhereAFullOneRefuses) {
  v1::JobConfig config = SparseJob(v1::MODE_ASYNC, v1::OPTIMIZER_SGD, /*max_rows=*/16);
  config.set_num_workers(1);  // async: each push at the whole lr
  config.mutable_sparse_tables(0)->set_eviction(v1::SparseTableSpec::EVICTION_LRU);
  std::unique_ptr<ShardStore> store = MakeStore(config);
  const std::vector<int64_t> ids = IdsOf(0, 40);
  // A pull creates nothing: the rows read as their initial values.
  absl::StatusOr<ShardStore::PulledRows> pulled = PullRows(*store, ids);
  ASSERT_TRUE(pulled.ok()) << pulled.status();
  EXPECT_EQ(TableStatus(store->ShardStatus()).rows(), 0u);
  for (uint64_t step = 0; step < 4; ++step) {
    const std::vector<int64_t> ten(ids.begin() + 10 * step, ids.begin() + 10 * step + 10);
    absl::StatusOr<ShardStore::SparsePushResult> push = store->PushSparse(
        Gradient(0, step, step, ten, std::vector<float>(ten.size() * kDim, 1.0f)));
    ASSERT_TRUE(push.ok()) << push.status();
  }
  const v1::SparseTableStatus status = TableStatus(store->ShardStatus());
  EXPECT_LE(status.rows(), 16u);
  EXPECT_EQ(status.rows_evicted(), 40u - status.rows());
  EXPECT_EQ(status.version(), 4u);
  // The last push's rows are held, trained; the first push's left.
  std::vector<float> trained = InitialRow(config, ids[39]);
  for (float& v : trained) v -= kLr;
  EXPECT_EQ(*store->TEST_ReadRow("emb", ids[39]), trained);
  EXPECT_FALSE(store->TEST_ReadRow("emb", ids[0]).ok());
  pulled = PullRows(*store, {ids[0]});
  ASSERT_TRUE(pulled.ok()) << pulled.status();
  EXPECT_EQ(FromF32Bytes(pulled->data), InitialRow(config, ids[0]));
}

TEST(SparseTable, RestoringTheInitialValuesDropsEveryRow) {
  const v1::JobConfig config = SparseJob(v1::MODE_ASYNC, v1::OPTIMIZER_SGD);
  std::unique_ptr<ShardStore> store = MakeStore(config);
  const std::vector<int64_t> ids = IdsOf(0, 1);
  ASSERT_TRUE(store->PushSparse(Gradient(0, 0, 0, ids, std::vector<float>(kDim, 1.0f))).ok());
  ASSERT_TRUE(store->Restore(2, 0, {}, {}).ok());
  const v1::SparseTableStatus table = TableStatus(store->ShardStatus());
  EXPECT_EQ(table.rows(), 0u);
  EXPECT_EQ(table.version(), 0u);
  absl::StatusOr<ShardStore::PulledRows> rows = PullRows(*store, ids);
  ASSERT_TRUE(rows.ok());
  EXPECT_THAT(FromF32Bytes(rows->data), ElementsAreArray(InitialRow(config, ids[0])));
}

TEST(SparseTable, TheHottestRowsShareIsReported) {
  const v1::JobConfig config = SparseJob(v1::MODE_ASYNC, v1::OPTIMIZER_SGD);
  std::unique_ptr<ShardStore> store = MakeStore(config);
  const std::vector<int64_t> ids = IdsOf(0, 200);
  ASSERT_TRUE(PullRows(*store, ids).ok());       // 200 rows, one pull each
  for (int i = 0; i < 98; ++i) ASSERT_TRUE(PullRows(*store, {ids[0], ids[1]}).ok());
  // The hottest 1% is 2 rows with 99 pulls each, of 396 pulls in all.
  EXPECT_NEAR(TableStatus(store->ShardStatus()).hottest_share(), 198.0 / 396.0, 1e-9);
}

// A push's rows count as its traffic once, whether the policy applies it as
// it is taken (async: one walk over its rows) or takes it first (sync sums
// it; ssp may apply others first).
TEST(SparseTable, APushCountsAsTrafficOnceInEveryMode) {
  for (v1::ConsistencyMode mode : {v1::MODE_ASYNC, v1::MODE_SYNC, v1::MODE_SSP}) {
    SCOPED_TRACE(v1::ConsistencyMode_Name(mode));
    const v1::JobConfig config = SparseJob(mode, v1::OPTIMIZER_SGD);
    std::unique_ptr<ShardStore> store = MakeStore(config);
    const std::vector<int64_t> ids = IdsOf(0, 200);
    const std::vector<int64_t> hot = {ids[0], ids[1]};
    const std::vector<float> grad(hot.size() * kDim, 0.5f);
    ASSERT_TRUE(PullRows(*store, ids).ok());  // 200 rows, one pull each
    for (uint64_t step = 0; step < 49; ++step)
      for (uint32_t rank : {0u, 1u}) {
        const uint64_t version = TableStatus(store->ShardStatus()).version();
        ASSERT_TRUE(store->PushSparse(Gradient(rank, step, version, hot, grad)).ok());
      }
    // The hottest 1% is 2 rows with 1 pull and 98 pushes each, of 396.
    const v1::SparseTableStatus table = TableStatus(store->ShardStatus());
    EXPECT_NEAR(table.hottest_share(), 198.0 / 396.0, 1e-9);
    EXPECT_EQ(table.rows(), 200u);
  }
}

// ---- The network edge ----

class SparseEdgeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    config_ = SparseJob(v1::MODE_ASYNC, v1::OPTIMIZER_SGD, /*max_rows=*/100);
    store_ = MakeStore(config_);
    ASSERT_NE(store_, nullptr);
    service_ = std::make_unique<ParameterServerService>(store_.get());
    absl::StatusOr<GrpcServer> server = StartGrpcServer("127.0.0.1:0", {service_.get()});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    stub_ = v1::ParameterServer::NewStub(MakeChannel(absl::StrCat("127.0.0.1:", server_.port)));
    own_ = IdsOf(0, 2);
    foreign_ = IdsOf(1, 1)[0];
  }
  void TearDown() override {
    if (server_.server != nullptr) server_.server->Shutdown();
  }

  v1::SparsePushRequest GoodPush(uint64_t step = 0) const {
    v1::SparsePushRequest r;
    r.set_job_id("sparse-job");
    r.set_worker_rank(0);
    r.set_incarnation(1);
    r.set_step(step);
    r.set_table("emb");
    for (int64_t id : own_) r.add_ids(id);
    r.set_dtype(v1::DTYPE_F32);
    r.set_gradients(F32Bytes(std::vector<float>(own_.size() * kDim, 1.0f)));
    return r;
  }
  grpc::Status PushSparse(const v1::SparsePushRequest& r, v1::SparsePushResponse* out = nullptr) {
    v1::SparsePushResponse ignored;
    grpc::ClientContext context;
    return stub_->PushSparse(&context, r, out != nullptr ? out : &ignored);
  }
  grpc::Status PullSparse(const std::vector<int64_t>& ids, v1::SparsePullResponse* out) {
    v1::SparsePullRequest r;
    r.set_job_id("sparse-job");
    r.set_table("emb");
    for (int64_t id : ids) r.add_ids(id);
    grpc::ClientContext context;
    return stub_->PullSparse(&context, r, out);
  }
  // A bad push is refused with `code`, its message says `why`, and no row,
  // version or counter but rejected_pushes moved.
  void ExpectRefused(const v1::SparsePushRequest& r, grpc::StatusCode code,
                     const std::string& why) {
    const v1::ShardStatus before = store_->ShardStatus();
    const grpc::Status s = PushSparse(r);
    EXPECT_EQ(s.error_code(), code) << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr(why));
    const v1::ShardStatus after = store_->ShardStatus();
    EXPECT_EQ(after.rejected_pushes(), before.rejected_pushes() + 1);
    EXPECT_EQ(TableStatus(after).rows(), TableStatus(before).rows());
    EXPECT_EQ(TableStatus(after).version(), TableStatus(before).version());
    EXPECT_EQ(TableStatus(after).rows_pushed(), TableStatus(before).rows_pushed());
    for (int64_t id : own_) EXPECT_FALSE(store_->TEST_ReadRow("emb", id).ok()) << id;
  }

  v1::JobConfig config_;
  std::unique_ptr<ShardStore> store_;
  std::unique_ptr<ParameterServerService> service_;
  GrpcServer server_;
  std::unique_ptr<v1::ParameterServer::Stub> stub_;
  std::vector<int64_t> own_;
  int64_t foreign_ = 0;
};

TEST_F(SparseEdgeTest, AGoodPushAndPullRoundTripOverGrpc) {
  v1::SparsePullResponse pulled;
  ASSERT_TRUE(PullSparse(own_, &pulled).ok());
  EXPECT_EQ(pulled.dtype(), v1::DTYPE_F32);
  EXPECT_EQ(pulled.version(), 0u);
  EXPECT_EQ(pulled.values().size(), own_.size() * kDim * sizeof(float));
  v1::SparsePushResponse response;
  ASSERT_TRUE(PushSparse(GoodPush(), &response).ok());
  EXPECT_EQ(response.version(), 1u);
  EXPECT_FALSE(response.duplicate());
  ASSERT_TRUE(PullSparse(own_, &pulled).ok());
  EXPECT_EQ(pulled.version(), 1u);
}

// A shard decodes a sparse push into a request message its thread keeps
// (the ids' room), and a worker sends from buffers it keeps: a call after a
// bigger one carries nothing of it, pull or push.
TEST_F(SparseEdgeTest, ACallCarriesNothingOfTheBiggerCallBefore) {
  const std::vector<int64_t> many = IdsOf(0, 40);
  v1::SparsePullResponse pulled;
  ASSERT_TRUE(PullSparse(many, &pulled).ok());
  ASSERT_EQ(pulled.values().size(), many.size() * kDim * sizeof(float));
  ASSERT_TRUE(PullSparse({many[7]}, &pulled).ok());
  ASSERT_EQ(pulled.values().size(), kDim * sizeof(float));
  EXPECT_EQ(pulled.values(), F32Bytes(*store_->TEST_ReadRow("emb", many[7])));

  v1::SparsePushRequest big = GoodPush(0);
  big.clear_ids();
  for (int64_t id : many) big.add_ids(id);
  big.set_gradients(F32Bytes(std::vector<float>(many.size() * kDim, 1.0f)));
  ASSERT_TRUE(PushSparse(big).ok());
  std::vector<std::vector<float>> after_big;
  for (int64_t id : many) after_big.push_back(*store_->TEST_ReadRow("emb", id));
  const uint64_t pushed = TableStatus(store_->ShardStatus()).rows_pushed();
  v1::SparsePushRequest small = GoodPush(1);
  small.clear_ids();
  small.add_ids(many[3]);
  small.set_gradients(F32Bytes(std::vector<float>(kDim, 1.0f)));
  ASSERT_TRUE(PushSparse(small).ok());
  EXPECT_EQ(TableStatus(store_->ShardStatus()).rows_pushed(), pushed + 1);
  for (size_t i = 0; i < many.size(); ++i) {
    if (i == 3)
      EXPECT_NE(*store_->TEST_ReadRow("emb", many[i]), after_big[i]);
    else
      EXPECT_EQ(*store_->TEST_ReadRow("emb", many[i]), after_big[i]) << "row " << i;
  }
}

TEST_F(SparseEdgeTest, ARetriedPushOverGrpcIsAppliedOnce) {
  ASSERT_TRUE(PushSparse(GoodPush()).ok());
  const std::vector<float> once = *store_->TEST_ReadRow("emb", own_[0]);
  v1::SparsePushResponse retry;
  ASSERT_TRUE(PushSparse(GoodPush(), &retry).ok());
  EXPECT_TRUE(retry.duplicate());
  EXPECT_EQ(retry.version(), 1u);
  EXPECT_EQ(*store_->TEST_ReadRow("emb", own_[0]), once);
  EXPECT_EQ(store_->ShardStatus().duplicate_pushes(), 1u);
}

TEST_F(SparseEdgeTest, AnIdOutsideTheTablesRangeIsRefused) {
  v1::SparsePushRequest r = GoodPush();
  r.set_ids(1, 1000);
  ExpectRefused(r, grpc::StatusCode::INVALID_ARGUMENT, "row id 1000 is outside sparse table 'emb'");
  r.set_ids(1, -1);
  ExpectRefused(r, grpc::StatusCode::INVALID_ARGUMENT, "row id -1 is outside");
}

TEST_F(SparseEdgeTest, ARowOfTheWrongWidthIsRefused) {
  v1::SparsePushRequest r = GoodPush();
  r.set_gradients(F32Bytes(std::vector<float>(own_.size() * kDim - 1, 1.0f)));
  ExpectRefused(r, grpc::StatusCode::INVALID_ARGUMENT, "expected 32 bytes of gradients (2 rows x 4");
}

TEST_F(SparseEdgeTest, DuplicateIdsInOnePushAreRefused) {
  v1::SparsePushRequest r = GoodPush();
  r.set_ids(1, own_[0]);
  ExpectRefused(r, grpc::StatusCode::INVALID_ARGUMENT,
                absl::StrCat("row id ", own_[0], " appears twice in one push"));
}

// An id twice is a matter of one push: the ids of one push are never
// "twice" in the next.
TEST_F(SparseEdgeTest, AnIdOfOnePushIsNotTwiceInTheNext) {
  for (uint64_t step = 0; step < 5; ++step) ASSERT_TRUE(PushSparse(GoodPush(step)).ok()) << step;
  v1::SparsePushRequest r = GoodPush(5);
  r.add_ids(own_[1]);
  r.set_gradients(F32Bytes(std::vector<float>((own_.size() + 1) * kDim, 1.0f)));
  const grpc::Status s = PushSparse(r);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr(absl::StrCat("row id ", own_[1], " appears twice")));
}

// A repeat among a push's many ids is found wherever it is, and the first
// in order is named; the check leaves nothing behind for the next push.
TEST_F(SparseEdgeTest, ARepeatAmongManyIdsIsRefusedNamingTheFirst) {
  const std::vector<int64_t> many = IdsOf(0, 400);
  ASSERT_EQ(many.size(), 400u);
  v1::SparsePushRequest r = GoodPush();
  r.clear_ids();
  for (int64_t id : many) r.add_ids(id);
  r.add_ids(many[250]);
  r.add_ids(many[10]);
  r.set_gradients(F32Bytes(std::vector<float>(r.ids_size() * kDim, 1.0f)));
  ExpectRefused(r, grpc::StatusCode::INVALID_ARGUMENT,
                absl::StrCat("row id ", many[250], " appears twice in one push"));
  v1::SparsePushRequest distinct = GoodPush();
  distinct.clear_ids();
  for (size_t i = 0; i < 90; ++i) distinct.add_ids(many[i]);
  distinct.set_gradients(F32Bytes(std::vector<float>(90 * kDim, 1.0f)));
  EXPECT_TRUE(PushSparse(distinct).ok());
}

// FirstRepeat exactly, where many ids share the bits of its first filter:
// 300,000 distinct ids (about one in eight checked exactly) have no
// repeat, and every repeat put among them is found, the first in order.
TEST(FirstRepeat, IsExactWhereTheIdsCrowdItsFilter) {
  std::vector<int64_t> ids;
  std::mt19937_64 random(7);
  absl::flat_hash_set<int64_t> taken;
  while (ids.size() < 300000) {
    const int64_t id = static_cast<int64_t>(random() >> 1);
    if (taken.insert(id).second) ids.push_back(id);
  }
  EXPECT_EQ(FirstRepeat(ids), std::nullopt);
  EXPECT_EQ(FirstRepeat({}), std::nullopt);
  std::vector<int64_t> twice = ids;
  twice.insert(twice.begin() + 200000, ids[123456]);
  twice.insert(twice.begin() + 250000, ids[7]);
  EXPECT_EQ(FirstRepeat(twice), ids[123456]);
  twice.insert(twice.begin() + 150000, ids[99]);  // now first
  EXPECT_EQ(FirstRepeat(twice), ids[99]);
  EXPECT_EQ(FirstRepeat(ids), std::nullopt);  // nothing left of the calls before
  EXPECT_EQ(FirstRepeat(std::vector<int64_t>{-5, 3, -5}), -5);
}

TEST_F(SparseEdgeTest, NonFiniteGradientsAreRefused) {
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    3e38f}) {
    v1::SparsePushRequest r = GoodPush();
    std::vector<float> values(own_.size() * kDim, 1.0f);
    values[kDim + 2] = bad;
    r.set_gradients(F32Bytes(values));
    ExpectRefused(r, grpc::StatusCode::INVALID_ARGUMENT,
                  absl::StrCat("gradient element 2 of row ", own_[1]));
  }
}

TEST_F(SparseEdgeTest, ARowOfAnotherShardOrAnUnknownTableIsNotFound) {
  v1::SparsePushRequest r = GoodPush();
  r.set_ids(0, foreign_);
  ExpectRefused(r, grpc::StatusCode::NOT_FOUND, "is held by shard 1, not shard 0");
  r = GoodPush();
  r.set_table("nope");
  ExpectRefused(r, grpc::StatusCode::NOT_FOUND, "no sparse table 'nope'");
  v1::SparsePullResponse pulled;
  EXPECT_EQ(PullSparse({foreign_}, &pulled).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(TableStatus(store_->ShardStatus()).rows(), 0u);
}

TEST_F(SparseEdgeTest, AnOtherJobOrAnUnknownRankIsRefused) {
  v1::SparsePushRequest r = GoodPush();
  r.set_job_id("other");
  ExpectRefused(r, grpc::StatusCode::FAILED_PRECONDITION, "request for job 'other'");
  r = GoodPush();
  r.set_worker_rank(7);
  ExpectRefused(r, grpc::StatusCode::INVALID_ARGUMENT, "unknown worker rank 7");
}

TEST_F(SparseEdgeTest, APullWhoseReplyNoMessageCarriesIsInvalidArgument) {
  // The caller's to cut smaller: not RESOURCE_EXHAUSTED, which a worker
  // waits out as a busy shard's (a job whose every pull was refused so hung).
  const std::vector<int64_t> many(kMaxMessageBytes / (kDim * sizeof(float)) + 1, own_[0]);
  v1::SparsePullResponse pulled;
  const grpc::Status s = PullSparse(many, &pulled);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("pull fewer rows per call"));
  EXPECT_EQ(TableStatus(store_->ShardStatus()).rows(), 0u);
}

TEST_F(SparseEdgeTest, APullPastTheRowLimitIsFailedPreconditionAndCreatesNothing) {
  std::vector<int64_t> many = IdsOf(0, 101);
  v1::SparsePullResponse pulled;
  const grpc::Status s = PullSparse(many, &pulled);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  EXPECT_EQ(TableStatus(store_->ShardStatus()).rows(), 0u);
}

TEST(SparseTableConfig, TablesAreValidated) {
  v1::JobConfig config = SparseJob(v1::MODE_SYNC, v1::OPTIMIZER_SGD);
  EXPECT_TRUE(ValidateJobConfig(config).ok());
  config.mutable_sparse_tables(0)->set_dim(0);
  EXPECT_THAT(ValidateJobConfig(config).message(), HasSubstr("dim must be in [1, 4096]"));
  config = SparseJob(v1::MODE_SYNC, v1::OPTIMIZER_SGD);
  *config.add_sparse_tables() = config.sparse_tables(0);
  EXPECT_THAT(ValidateJobConfig(config).message(), HasSubstr("appears twice"));
  config = SparseJob(v1::MODE_SYNC, v1::OPTIMIZER_SGD);
  config.mutable_sparse_tables(0)->set_name("bad name");
  EXPECT_THAT(ValidateJobConfig(config).message(), HasSubstr("[A-Za-z0-9_.-]"));
  config = SparseJob(v1::MODE_SYNC, v1::OPTIMIZER_SGD);
  config.set_checkpoint_dir("/tmp/x");
  EXPECT_TRUE(ValidateJobConfig(config).ok());
}

// ---- Checkpoints ----

// Checkpoint 1 of `stores` (shards 0..n-1 of `config`), as each is now,
// written under `root` with its manifest. The folder.
std::string WriteCheckpoint(const std::string& root, const v1::JobConfig& config,
                            const std::vector<std::unique_ptr<ShardStore>>& stores) {
  const std::string dir = CheckpointFolder(root, 1);
  v1::CheckpointRequest request;
  request.set_id(1);
  v1::CheckpointManifest manifest;
  manifest.set_job_id(config.job_id());
  manifest.set_id(1);
  *manifest.mutable_shard_map() = MapOf(config);
  *manifest.mutable_config() = config;
  for (const std::unique_ptr<ShardStore>& store : stores) {
    absl::StatusOr<v1::ShardCheckpointFile> file =
        store->CaptureCheckpoint(request, absl::Now() + absl::Seconds(5));
    EXPECT_TRUE(file.ok()) << file.status();
    absl::StatusOr<v1::ShardCheckpoint> written = WriteShardFile(Env::Default(), dir, *file);
    EXPECT_TRUE(written.ok()) << written.status();
    *manifest.add_shards() = *written;
  }
  EXPECT_TRUE(WriteManifest(Env::Default(), dir, manifest).ok());
  return dir;
}

// Every shard of `config` re-sharded to `shards`, each restored from the
// checkpoint in `dir` (null where a restore failed).
std::vector<std::unique_ptr<ShardStore>> RestoredShards(const std::string& dir,
                                                        const v1::CheckpointManifest& manifest,
                                                        v1::JobConfig config, uint32_t shards) {
  config.set_num_servers(shards);
  const v1::ShardMap map = MapOf(config);
  std::vector<std::unique_ptr<ShardStore>> restored;
  for (uint32_t k = 0; k < shards; ++k) {
    absl::StatusOr<ShardState> state =
        LoadShardState(Env::Default(), dir, manifest, ChunksOfShard(map, k), shards, k);
    EXPECT_TRUE(state.ok()) << state.status();
    restored.push_back(state.ok() ? MakeStore(config, k, &*state) : nullptr);
  }
  return restored;
}

class SparseCheckpointTest : public ::testing::Test {
 protected:
  TempFolders temp_;
  const std::string root_ = temp_.Make("sparse_checkpoint_test");
};

// Two shards' rows and optimizer state under `config` (async, one worker),
// checkpointed and restored into three shards and into one: every row the
// same, and its next update the same as on the old shard.
void RestoresBitForBitIntoThreeShardsOrOne(const std::string& root, v1::JobConfig config) {
  // Two shards, each with 30 rows that had from 1 to 3 updates.
  std::vector<std::unique_ptr<ShardStore>> before;
  std::vector<int64_t> all;
  for (uint32_t shard : {0u, 1u}) {
    before.push_back(MakeStore(config, shard));
    const std::vector<int64_t> ids = IdsOf(shard, 30);
    all.insert(all.end(), ids.begin(), ids.end());
    for (uint64_t step = 0; step < 3; ++step) {
      std::vector<int64_t> some(ids.begin() + 10 * step, ids.end());
      std::vector<float> grad(some.size() * kDim);
      for (size_t i = 0; i < grad.size(); ++i) grad[i] = 0.1f * static_cast<float>(i % 7) - 0.3f;
      ASSERT_TRUE(before[shard]->PushSparse(Gradient(0, step, step, some, grad)).ok());
    }
  }
  const std::string dir = WriteCheckpoint(root, config, before);
  absl::StatusOr<v1::CheckpointManifest> manifest = VerifyCheckpoint(Env::Default(), dir, "");
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_EQ(manifest->shards(0).num_tables(), 1u);
  EXPECT_EQ(manifest->shards(0).num_rows() + manifest->shards(1).num_rows(), all.size());

  for (uint32_t shards : {3u, 1u}) {
    SCOPED_TRACE(absl::StrCat(shards, " shards"));
    std::vector<std::unique_ptr<ShardStore>> after = RestoredShards(dir, *manifest, config, shards);
    uint64_t rows = 0;
    for (const std::unique_ptr<ShardStore>& store : after) {
      ASSERT_NE(store, nullptr);
      rows += TableStatus(store->ShardStatus()).rows();
      EXPECT_EQ(TableStatus(store->ShardStatus()).version(), 3u);
    }
    // Every row is on exactly one new shard, as it was.
    EXPECT_EQ(rows, all.size());
    for (int64_t id : all) {
      ShardStore& was = *before[SparseShardOf(id, 2)];
      ShardStore& is = *after[SparseShardOf(id, shards)];
      EXPECT_EQ(*is.TEST_ReadRow("emb", id), *was.TEST_ReadRow("emb", id)) << "row " << id;
    }
    // The optimizer state came too: the same next update moves a row the
    // same way as on a copy of the old shard restored from the same files
    // (Adam's moments and the row's own update count). (`before` stays as
    // captured, for the next shard count.)
    const int64_t id = all.front();
    const std::vector<int64_t> ids{id};
    const std::vector<float> grad{0.5f, -0.25f, 1.0f, 2.0f};
    const uint32_t old_shard = SparseShardOf(id, 2);
    absl::StatusOr<ShardState> state = LoadShardState(
        Env::Default(), dir, *manifest, ChunksOfShard(MapOf(config), old_shard), 2, old_shard);
    ASSERT_TRUE(state.ok()) << state.status();
    std::unique_ptr<ShardStore> twin = MakeStore(config, old_shard, &*state);
    ShardStore& moved = *after[SparseShardOf(id, shards)];
    for (ShardStore* store : {&moved, twin.get()}) {
      absl::StatusOr<ShardStore::SparsePushResult> pushed =
          store->PushSparse(Gradient(0, 3, 3, ids, grad));
      ASSERT_TRUE(pushed.ok()) << pushed.status();
      EXPECT_FALSE(pushed->duplicate);
    }
    EXPECT_NE(*moved.TEST_ReadRow("emb", id), *before[old_shard]->TEST_ReadRow("emb", id));
    EXPECT_EQ(*moved.TEST_ReadRow("emb", id), *twin->TEST_ReadRow("emb", id));
  }
}

TEST_F(SparseCheckpointTest, RowsAndAdamStateRestoreBitForBitIntoThreeShardsOrOne) {
  v1::JobConfig config = SparseJob(v1::MODE_ASYNC, v1::OPTIMIZER_ADAM);
  config.mutable_optimizer()->set_beta1(0.9f);
  config.mutable_optimizer()->set_beta2(0.999f);
  config.mutable_optimizer()->set_epsilon(1e-8f);
  config.set_num_workers(1);
  RestoresBitForBitIntoThreeShardsOrOne(root_, config);
}

// Row-wise AdaGrad's one float of state a row moves with its row.
TEST_F(SparseCheckpointTest, RowwiseAdagradStateRestoresBitForBitIntoThreeShardsOrOne) {
  v1::JobConfig config = SparseJob(v1::MODE_ASYNC, v1::OPTIMIZER_ADAGRAD);
  config.mutable_optimizer()->set_epsilon(1e-7f);
  config.mutable_sparse_tables(0)->set_rowwise_adagrad(true);
  config.set_num_workers(1);
  RestoresBitForBitIntoThreeShardsOrOne(root_, config);
}

// The counts of the shards' states (v1::StateCounters) as their status
// reports them, summed over `stores`: pushes, duplicates, updates, too
// stale, staleness count and sum, late.
std::vector<uint64_t> StateCounts(const std::vector<std::unique_ptr<ShardStore>>& stores) {
  std::vector<uint64_t> sum(7, 0);
  for (const std::unique_ptr<ShardStore>& store : stores) {
    const v1::ShardStatus s = store->ShardStatus();
    uint64_t staleness_count = 0;
    for (uint64_t n : s.staleness_histogram()) staleness_count += n;
    const uint64_t counts[] = {s.pushes(),    s.duplicate_pushes(),
                               s.updates_applied(), s.too_stale(), staleness_count,
                               static_cast<uint64_t>(s.staleness_mean() * staleness_count + 0.5),
                               s.late_gradients()};
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += counts[i];
  }
  return sum;
}

TEST_F(SparseCheckpointTest, TheStatesCountsAreConservedIntoThreeShardsOrOne) {
  // Async with max_staleness 1, 2 shards: each worker pushes every dense
  // chunk and some rows three times on version 0 (staleness 0, 1, then too
  // stale), and retries its last push (a duplicate).
  v1::JobConfig config = SparseJob(v1::MODE_ASYNC, v1::OPTIMIZER_SGD);
  config.set_max_staleness(1);
  const v1::ShardMap map = MapOf(config);
  std::vector<std::unique_ptr<ShardStore>> before;
  for (uint32_t shard : {0u, 1u}) {
    before.push_back(MakeStore(config, shard));
    ShardStore& store = *before.back();
    const std::vector<int64_t> ids = IdsOf(shard, 5);
    const std::vector<float> rows(ids.size() * kDim, 0.25f);
    std::vector<std::vector<float>> grads;
    for (uint32_t c : ChunksOfShard(map, shard))
      grads.emplace_back(map.chunks(c).num_elements(), 0.5f);
    auto push = [&](uint32_t rank, uint64_t step) {
      ASSERT_TRUE(store.PushSparse(Gradient(rank, step, 0, ids, rows)).ok());
      ShardStore::GradientPush dense;
      dense.worker_rank = rank;
      dense.incarnation = 1;
      dense.step = step;
      for (size_t i = 0; i < grads.size(); ++i)
        dense.chunks.push_back({ChunksOfShard(map, shard)[i], 0, grads[i], 0});
      ASSERT_TRUE(store.Push(dense).ok());
    };
    for (uint64_t step = 0; step < 3; ++step)
      for (uint32_t rank : {0u, 1u}) push(rank, step);
    push(1, 2);
  }
  const std::vector<uint64_t> counts = StateCounts(before);
  EXPECT_GT(counts[0], 0u);  // pushes
  EXPECT_GT(counts[1], 0u);  // duplicates
  EXPECT_GT(counts[2], 0u);  // updates
  EXPECT_GT(counts[3], 0u);  // too stale
  EXPECT_EQ(counts[0] - counts[1] - counts[3], counts[2]);
  const std::string dir = WriteCheckpoint(root_, config, before);
  absl::StatusOr<v1::CheckpointManifest> manifest = VerifyCheckpoint(Env::Default(), dir, "");
  ASSERT_TRUE(manifest.ok()) << manifest.status();

  for (uint32_t shards : {3u, 2u, 1u}) {
    SCOPED_TRACE(absl::StrCat(shards, " shards"));
    std::vector<std::unique_ptr<ShardStore>> after = RestoredShards(dir, *manifest, config, shards);
    for (const std::unique_ptr<ShardStore>& store : after) ASSERT_NE(store, nullptr);
    EXPECT_EQ(StateCounts(after), counts);
  }
}

// A table's state as a full checkpoint holds it, by id: values, optimizer
// state, update count and idle time of each row; and the ids waiting for
// admission with their counts and idle times; and the clock.
struct TableRows {
  std::map<int64_t, std::tuple<std::string, std::string, uint32_t, uint64_t>> rows;
  std::map<int64_t, std::pair<uint32_t, uint64_t>> waiting;
  uint64_t version = 0;
  bool operator==(const TableRows& o) const {
    return rows == o.rows && waiting == o.waiting && version == o.version;
  }
};
void AddTableRows(const v1::TableState& t, TableRows* out) {
  const size_t row_bytes = t.dim() * sizeof(float);
  const size_t state_bytes = TableStateWidth(t) * sizeof(float);
  for (int i = 0; i < t.ids_size(); ++i) {
    std::string state;
    for (const std::string& slot : t.optimizer_state())
      state += slot.substr(i * state_bytes, state_bytes);
    out->rows[t.ids(i)] = {t.values().substr(i * row_bytes, row_bytes), state,
                           t.updates_size() == 0 ? 0 : t.updates(i),
                           t.row_idle_size() == 0 ? 0 : t.row_idle(i)};
  }
  for (int i = 0; i < t.pending_ids_size(); ++i)
    out->waiting[t.pending_ids(i)] = {t.pending_counts(i), t.pending_idle(i)};
  out->version = std::max(out->version, t.version());
}

// The table's rows of a full capture of `stores` now (a capture starts the
// changes an incremental checkpoint takes again: not of shards that take them).
TableRows Captured(const std::vector<std::unique_ptr<ShardStore>>& stores) {
  TableRows out;
  v1::CheckpointRequest request;
  request.set_id(99);
  for (const std::unique_ptr<ShardStore>& store : stores) {
    absl::StatusOr<v1::ShardCheckpointFile> file =
        store->CaptureCheckpoint(request, absl::Now() + absl::Seconds(5));
    EXPECT_TRUE(file.ok()) << file.status();
    if (file.ok()) AddTableRows(file->tables(0), &out);
  }
  return out;
}

TEST_F(SparseCheckpointTest, AManagedTableRestoresItsRowsAgesAndWaitingIdsIntoThreeShardsOrOne) {
  // Async, 1 worker, 2 shards: every push is one update of the table on
  // each shard, so both shards' clocks are 6 and every idle time is the
  // same on the new shards, whose clock is the largest of the files'.
  v1::JobConfig config = SparseJob(v1::MODE_ASYNC, v1::OPTIMIZER_SGD, /*max_rows=*/64);
  config.set_num_workers(1);
  v1::SparseTableSpec* table = config.mutable_sparse_tables(0);
  table->set_eviction(v1::SparseTableSpec::EVICTION_LRU);
  table->set_admit_after(2);
  std::vector<std::unique_ptr<ShardStore>> before;
  for (uint32_t shard : {0u, 1u}) {
    before.push_back(MakeStore(config, shard));
    const std::vector<int64_t> ids = IdsOf(shard, 28);
    for (uint64_t step = 0; step < 6; ++step) {
      // Rows 0..(4 step + 7): the first ones often, the last four once.
      std::vector<int64_t> some(ids.begin(), ids.begin() + 4 * step + 8);
      ASSERT_TRUE(before[shard]
                      ->PushSparse(Gradient(0, step, step, some,
                                            std::vector<float>(some.size() * kDim, 0.5f)))
                      .ok());
    }
  }
  const TableRows was = Captured(before);
  ASSERT_FALSE(was.rows.empty());
  ASSERT_FALSE(was.waiting.empty());
  const std::string dir = WriteCheckpoint(root_, config, before);
  absl::StatusOr<v1::CheckpointManifest> manifest = VerifyCheckpoint(Env::Default(), dir, "");
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  for (uint32_t shards : {3u, 1u}) {
    SCOPED_TRACE(absl::StrCat(shards, " shards"));
    std::vector<std::unique_ptr<ShardStore>> after = RestoredShards(dir, *manifest, config, shards);
    for (const std::unique_ptr<ShardStore>& store : after) ASSERT_NE(store, nullptr);
    EXPECT_TRUE(Captured(after) == was);
  }
}

TEST_F(SparseCheckpointTest, ASyncCheckpointTakesTheTableAtItsStepAndRetriesStayExactlyOnce) {
  const v1::JobConfig config = SparseJob(v1::MODE_SYNC, v1::OPTIMIZER_SGD);
  std::unique_ptr<ShardStore> store = MakeStore(config);
  const std::vector<int64_t> ids = IdsOf(0, 1);
  const std::vector<float> one(kDim, 1.0f);
  // Armed for version 1 before step 0 completes; step 1 follows at once.
  v1::CheckpointRequest request;
  request.set_id(1);
  request.set_version(1);
  ASSERT_TRUE(store->ArmCheckpoint(request).ok());
  // The dense chunks beside the table take each step too (zero gradients).
  const v1::ShardMap map = MapOf(config);
  std::vector<std::vector<float>> zeros;
  for (uint32_t c : ChunksOfShard(map, 0)) zeros.emplace_back(map.chunks(c).num_elements(), 0.0f);
  for (uint64_t step : {0u, 1u})
    for (uint32_t rank : {0u, 1u}) {
      ASSERT_TRUE(store->PushSparse(Gradient(rank, step, step, ids, one)).ok());
      ShardStore::GradientPush dense;
      dense.worker_rank = rank;
      dense.incarnation = 1;
      dense.step = step;
      for (size_t i = 0; i < zeros.size(); ++i)
        dense.chunks.push_back({ChunksOfShard(map, 0)[i], step, zeros[i], 0});
      ASSERT_TRUE(store->Push(dense).ok());
    }
  absl::StatusOr<v1::ShardCheckpointFile> file =
      store->CollectCheckpoint(1, absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_EQ(file->tables_size(), 1);
  const v1::TableState& table = file->tables(0);
  EXPECT_EQ(table.version(), 1u);
  ASSERT_EQ(table.ids_size(), 1);
  std::vector<float> after_step0 = InitialRow(config, ids[0]);
  for (float& v : after_step0) v -= kLr;
  EXPECT_EQ(FromF32Bytes(table.values()), after_step0);
  // The marks say step 0 was applied, not step 1 (in no checkpoint's values).
  ASSERT_EQ(table.marks_size(), 2);
  EXPECT_TRUE(table.marks(0).valid());
  EXPECT_EQ(table.marks(0).step(), 0u);

  // Rolled back to it: a retry of step 0 is a duplicate, step 1 is taken.
  ASSERT_TRUE(store->Restore(2, 1, {file->chunks().begin(), file->chunks().end()}, {1, 1},
                             {file->tables().begin(), file->tables().end()})
                  .ok());
  absl::StatusOr<ShardStore::SparsePushResult> retry =
      store->PushSparse(Gradient(0, 0, 0, ids, one));
  ASSERT_TRUE(retry.ok()) << retry.status();
  EXPECT_TRUE(retry->duplicate);
  EXPECT_EQ(*store->TEST_ReadRow("emb", ids[0]), after_step0);
  for (uint32_t rank : {0u, 1u}) {
    absl::StatusOr<ShardStore::SparsePushResult> again =
        store->PushSparse(Gradient(rank, 1, 1, ids, one));
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_FALSE(again->duplicate);
  }
  EXPECT_EQ(TableStatus(store->ShardStatus()).version(), 2u);
}

TEST_F(SparseCheckpointTest, ATableStateThatDoesNotFitChangesNothing) {
  const v1::JobConfig config = SparseJob(v1::MODE_ASYNC, v1::OPTIMIZER_MOMENTUM, /*max_rows=*/3);
  std::unique_ptr<ShardStore> store = MakeStore(config);
  const std::vector<int64_t> ids = IdsOf(0, 4);
  ASSERT_TRUE(store->PushSparse(Gradient(0, 0, 0, {ids[0]}, std::vector<float>(kDim, 1))).ok());
  const std::vector<float> row = *store->TEST_ReadRow("emb", ids[0]);
  v1::CheckpointRequest request;
  request.set_id(1);
  absl::StatusOr<v1::ShardCheckpointFile> file =
      store->CaptureCheckpoint(request, absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(file.ok()) << file.status();
  const std::vector<v1::ChunkState> chunks(file->chunks().begin(), file->chunks().end());
  const v1::TableState good = file->tables(0);
  auto restore = [&](const v1::TableState& t) {
    return store->Restore(2, 1, chunks, {}, std::vector<v1::TableState>{t});
  };
  auto with_row = [&](int64_t id) {
    v1::TableState t = good;
    t.add_ids(id);
    t.mutable_values()->append(kDim * sizeof(float), '\0');
    t.mutable_optimizer_state(0)->append(kDim * sizeof(float), '\0');
    t.add_updates(1);
    return t;
  };
  v1::TableState t = with_row(IdsOf(1, 1)[0]);
  EXPECT_THAT(restore(t).message(), HasSubstr("another shard's"));
  t = with_row(ids[0]);
  EXPECT_THAT(restore(t).message(), HasSubstr("appears twice"));
  t = good;
  t.set_dim(kDim + 1);
  EXPECT_THAT(restore(t).message(), HasSubstr("rows of 5 values"));
  t = good;
  t.clear_optimizer_state();
  EXPECT_THAT(restore(t).message(), HasSubstr("optimizer state slots"));
  t = with_row(ids[1]);
  t = [&] {
    v1::TableState u = t;
    for (int64_t id : {ids[2], ids[3]}) {
      u.add_ids(id);
      u.mutable_values()->append(kDim * sizeof(float), '\0');
      u.mutable_optimizer_state(0)->append(kDim * sizeof(float), '\0');
      u.add_updates(1);
    }
    return u;
  }();
  const absl::Status over = restore(t);
  EXPECT_EQ(over.code(), absl::StatusCode::kFailedPrecondition) << over;
  EXPECT_THAT(over.message(), HasSubstr("max_rows_per_shard"));
  t = good;
  t.set_name("other");
  EXPECT_THAT(restore(t).message(), HasSubstr("table 'other' this job has not"));
  EXPECT_THAT(store->Restore(2, 1, chunks, {}, {}).message(),
              HasSubstr("no state for table 'emb'"));
  // Nothing changed: the generation, the row, the version.
  EXPECT_EQ(store->generation(), 0u);
  EXPECT_EQ(*store->TEST_ReadRow("emb", ids[0]), row);
  EXPECT_EQ(TableStatus(store->ShardStatus()).rows(), 1u);
  EXPECT_EQ(TableStatus(store->ShardStatus()).version(), 1u);
  // And the good state restores.
  EXPECT_TRUE(restore(good).ok());
  EXPECT_EQ(*store->TEST_ReadRow("emb", ids[0]), row);
}

TEST_F(SparseCheckpointTest, AFileWithARowOfAnotherShardOrAnotherWidthIsDamaged) {
  const v1::JobConfig config = SparseJob(v1::MODE_ASYNC, v1::OPTIMIZER_SGD);
  std::vector<std::unique_ptr<ShardStore>> stores;
  stores.push_back(MakeStore(config, 0));
  stores.push_back(MakeStore(config, 1));
  ASSERT_TRUE(stores[0]->PushSparse(Gradient(0, 0, 0, IdsOf(0, 2), std::vector<float>(2 * kDim, 1))).ok());
  const std::string dir = WriteCheckpoint(root_, config, stores);
  ASSERT_TRUE(VerifyCheckpoint(Env::Default(), dir, "").ok());
  // The job's table is now wider than the rows in the files.
  absl::StatusOr<v1::CheckpointManifest> manifest = ReadManifest(Env::Default(), dir);
  ASSERT_TRUE(manifest.ok());
  v1::JobConfig wider = config;
  wider.mutable_sparse_tables(0)->set_dim(kDim * 2);
  EXPECT_THAT(CheckSameTables(manifest->config(), wider).message(), HasSubstr("rows of 4 there, 8 here"));
  // Or has another range of ids: an id names another feature there.
  v1::JobConfig other_range = config;
  other_range.mutable_sparse_tables(0)->set_rows(config.sparse_tables(0).rows() + 1);
  EXPECT_THAT(CheckSameTables(manifest->config(), other_range).message(),
              HasSubstr(absl::StrCat(config.sparse_tables(0).rows(), " rows there, ",
                                     config.sparse_tables(0).rows() + 1, " here")));
  manifest->mutable_config()->mutable_sparse_tables(0)->set_dim(kDim * 2);
  ASSERT_TRUE(WriteManifest(Env::Default(), dir, *manifest).ok());
  EXPECT_THAT(VerifyCheckpoint(Env::Default(), dir, "").status().message(),
              HasSubstr("does not fit the job's table 'emb'"));
  // Shard 1's file with shard 0's rows, which hash to shard 0.
  manifest->mutable_config()->mutable_sparse_tables(0)->set_dim(kDim);
  v1::CheckpointRequest request;
  request.set_id(1);
  absl::StatusOr<v1::ShardCheckpointFile> file =
      stores[1]->CaptureCheckpoint(request, absl::Now() + absl::Seconds(5));
  absl::StatusOr<v1::ShardCheckpointFile> of_shard0 =
      stores[0]->CaptureCheckpoint(request, absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(file.ok() && of_shard0.ok());
  *file->mutable_tables() = of_shard0->tables();
  absl::StatusOr<v1::ShardCheckpoint> written = WriteShardFile(Env::Default(), dir, *file);
  ASSERT_TRUE(written.ok());
  *manifest->mutable_shards(1) = *written;
  ASSERT_TRUE(WriteManifest(Env::Default(), dir, *manifest).ok());
  absl::Status damaged = VerifyCheckpoint(Env::Default(), dir, "").status();
  EXPECT_EQ(damaged.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(damaged.message()), HasSubstr("belongs to another shard"));
}

// ---- Incremental checkpoints (JobConfig.checkpoint_full_every) ----

// Shards that take their checkpoints as grps-server does (ShardCheckpointer:
// full, or incremental on the one before), into `root`, with the manifests
// the coordinator would write.
class CheckpointingShards {
 public:
  CheckpointingShards(const std::string& root, const v1::JobConfig& config)
      : root_(root), config_(config) {
    // spdlog's registry comes up on its first use: here, before the
    // checkpointers' threads log (as grps-server's main logs first); two
    // threads' first uses at once race inside the uninstrumented library.
    spdlog::default_logger();
    for (uint32_t shard = 0; shard < config.num_servers(); ++shard) {
      stores.push_back(MakeStore(config, shard));
      checkpointers_.push_back(std::make_unique<ShardCheckpointer>(stores.back().get(), ""));
    }
  }
  ~CheckpointingShards() {
    for (auto& c : checkpointers_) c->Join();
  }

  // Checkpoint `id` of every shard and its manifest; the manifest.
  v1::CheckpointManifest Take(uint64_t id) {
    v1::CheckpointRequest request;
    request.set_id(id);
    request.set_dir(CheckpointFolder(root_, id));
    v1::CheckpointManifest manifest;
    manifest.set_job_id(config_.job_id());
    manifest.set_id(id);
    *manifest.mutable_shard_map() = MapOf(config_);
    *manifest.mutable_config() = config_;
    for (size_t k = 0; k < stores.size(); ++k) checkpointers_[k]->MaybeStart(request);
    for (size_t k = 0; k < stores.size(); ++k) {
      v1::ShardCheckpoint report;
      for (int i = 0; i < 5000; ++i) {
        report = stores[k]->ShardStatus().checkpoint();
        if (report.id() == id && report.state() != v1::CHECKPOINT_STATE_PENDING) break;
        absl::SleepFor(absl::Milliseconds(1));
      }
      EXPECT_EQ(report.state(), v1::CHECKPOINT_STATE_WRITTEN) << report.error();
      *manifest.add_shards() = report;
    }
    EXPECT_TRUE(WriteManifest(Env::Default(), request.dir(), manifest).ok());
    return manifest;
  }

  std::vector<std::unique_ptr<ShardStore>> stores;

 private:
  const std::string root_;
  const v1::JobConfig config_;
  std::vector<std::unique_ptr<ShardCheckpointer>> checkpointers_;
};

// The table's rows of checkpoint `dir` restored into `shards` shards.
TableRows Restored(const std::string& dir, const v1::CheckpointManifest& manifest,
                   const v1::JobConfig& config, uint32_t shards) {
  v1::JobConfig into = config;
  into.set_num_servers(shards);
  const v1::ShardMap map = MapOf(into);
  TableRows out;
  for (uint32_t k = 0; k < shards; ++k) {
    absl::StatusOr<ShardState> state =
        LoadShardState(Env::Default(), dir, manifest, ChunksOfShard(map, k), shards, k);
    EXPECT_TRUE(state.ok()) << state.status();
    if (state.ok()) AddTableRows(state->tables[0], &out);
  }
  return out;
}

// The chain tests' job: a managed table (LFU, capacity 40 a shard,
// admission after 2 updates, Adam) over 2 shards, one async worker; a full
// checkpoint, then at most 3 incremental ones. `part_kib`: the most a
// shard's file holds before its rows go to part files (0: 1 GiB).
v1::JobConfig ChainJob(const std::string& root, uint32_t part_kib = 0) {
  v1::JobConfig config = SparseJob(v1::MODE_ASYNC, v1::OPTIMIZER_ADAM, /*max_rows=*/40);
  config.mutable_optimizer()->set_beta1(0.9f);
  config.mutable_optimizer()->set_beta2(0.999f);
  config.mutable_optimizer()->set_epsilon(1e-8f);
  config.set_num_workers(1);
  config.set_checkpoint_dir(root);
  config.set_checkpoint_full_every(3);
  config.set_checkpoint_part_kib(part_kib);
  v1::SparseTableSpec* table = config.mutable_sparse_tables(0);
  table->set_eviction(v1::SparseTableSpec::EVICTION_LFU);
  table->set_admit_after(2);
  EXPECT_TRUE(ValidateJobConfig(config).ok());
  return config;
}

// Push `step` of the chain tests, of rank 0 to shard `k` of 2 (into each of
// `stores`): 12 of the shard's 200 ids, so that over the rounds rows are
// created, updated, evicted and come back.
void PushChainRound(uint32_t k, uint64_t step, std::initializer_list<ShardStore*> stores) {
  const std::vector<int64_t> pool = IdsOf(k, 200);
  std::vector<int64_t> ids;
  for (uint64_t i = 0; i < 12; ++i) ids.push_back(pool[(step * 37 + i * i * 7 + i) % pool.size()]);
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  std::vector<float> grad(ids.size() * kDim);
  for (size_t i = 0; i < grad.size(); ++i)
    grad[i] = 0.01f * static_cast<float>((i + step) % 13) - 0.05f;
  for (ShardStore* store : stores)
    ASSERT_TRUE(store->PushSparse(Gradient(0, step, step, ids, grad)).ok());
}

// An async SGD job of one worker over 2 shards whose checkpoints are
// incremental, with a full one every `full_every`.
v1::JobConfig IncrementalJob(const std::string& root, uint32_t full_every) {
  v1::JobConfig config = SparseJob(v1::MODE_ASYNC, v1::OPTIMIZER_SGD);
  config.set_num_workers(1);
  config.set_checkpoint_dir(root);
  config.set_checkpoint_full_every(full_every);
  return config;
}

// The chain job's rounds (PushChainRound) and 7 checkpoints into `root`;
// twin shards take the same pushes and a full capture each round: the
// truth. Each checkpoint restores it into 2, 3 and 1 shards exactly.
void ExpectAChainRestoresBitForBit(const std::string& root, uint32_t part_kib) {
  const v1::JobConfig config = ChainJob(root, part_kib);
  CheckpointingShards shards(root, config);
  std::vector<std::unique_ptr<ShardStore>> twins;
  for (uint32_t k = 0; k < 2; ++k) twins.push_back(MakeStore(config, k));
  std::map<uint64_t, v1::CheckpointManifest> taken;
  int split = 0;  // full files of more than one part
  uint64_t step = 0;
  for (uint64_t id = 1; id <= 7; ++id) {
    SCOPED_TRACE(absl::StrCat("checkpoint ", id));
    for (int round = 0; round < 3; ++round, ++step)
      for (uint32_t k = 0; k < 2; ++k)
        PushChainRound(k, step, {shards.stores[k].get(), twins[k].get()});
    const v1::CheckpointManifest manifest = shards.Take(id);
    // Full at 1 and 5; 2..4 and 6..7 on the one before.
    const int chain = static_cast<int>((id - 1) % 4);
    for (const v1::ShardCheckpoint& s : manifest.shards()) {
      ASSERT_EQ(s.chain_size(), chain);
      for (int i = 0; i < chain; ++i) EXPECT_EQ(s.chain(i).id(), id - chain + i);
      // Split where asked: a full file's rows in parts of 14 (a row of
      // Adam with its count and age: 73 bytes at most in a part of 1 KiB).
      if (part_kib == 0) {
        EXPECT_EQ(s.parts_size(), 0);
      } else if (chain == 0 && s.num_rows() > 14) {
        EXPECT_EQ(s.parts_size(), static_cast<int>((s.num_rows() + 13) / 14));
        ++split;
      }
      uint64_t in_parts = 0;
      for (const v1::ShardFilePart& part : s.parts()) {
        EXPECT_LE(part.rows(), 14u);
        in_parts += part.rows();
      }
      if (s.parts_size() > 0) {
        EXPECT_EQ(in_parts, s.num_rows());
      }
      // A chain names the parts of each earlier file as its manifest did.
      for (int i = 0; i < chain; ++i) {
        const v1::ShardCheckpoint& then = taken.at(s.chain(i).id()).shards(s.shard());
        ASSERT_EQ(s.chain(i).parts_size(), then.parts_size());
        for (int p = 0; p < then.parts_size(); ++p)
          EXPECT_EQ(s.chain(i).parts(p).SerializeAsString(), then.parts(p).SerializeAsString());
      }
    }
    taken[id] = manifest;
    const TableRows truth = Captured(twins);
    ASSERT_FALSE(truth.waiting.empty());
    const std::string dir = CheckpointFolder(root, id);
    absl::StatusOr<v1::CheckpointManifest> verified = VerifyCheckpoint(Env::Default(), dir, "");
    ASSERT_TRUE(verified.ok()) << verified.status();
    for (uint32_t into : {2u, 3u, 1u}) {
      SCOPED_TRACE(absl::StrCat(into, " shards"));
      EXPECT_TRUE(Restored(dir, *verified, config, into) == truth);
    }
  }
  for (const auto& twin : twins) EXPECT_GT(TableStatus(twin->ShardStatus()).rows_evicted(), 0u);
  if (part_kib > 0) {
    EXPECT_EQ(split, 2);  // checkpoint 5's
  }
}

TEST_F(SparseCheckpointTest, AChainOfIncrementsRestoresBitForBitIntoAnyShardCount) {
  ExpectAChainRestoresBitForBit(root_, /*part_kib=*/0);
}

TEST_F(SparseCheckpointTest, RowsPastThePartSizeAreInPartFilesAndRestoreBitForBit) {
  ExpectAChainRestoresBitForBit(root_, /*part_kib=*/1);
}

TEST_F(SparseCheckpointTest, ADamagedMissingOrMisrecordedPartIsRefusedNamingIt) {
  const v1::JobConfig config = ChainJob(root_, /*part_kib=*/1);
  CheckpointingShards shards(root_, config);
  for (uint64_t step = 0; step < 12; ++step)
    for (uint32_t k = 0; k < 2; ++k) PushChainRound(k, step, {shards.stores[k].get()});
  const v1::CheckpointManifest manifest = shards.Take(1);
  const std::string dir = CheckpointFolder(root_, 1);
  ASSERT_TRUE(VerifyCheckpoint(Env::Default(), dir, "").ok());
  ASSERT_GE(manifest.shards(1).parts_size(), 2);
  const std::string part = JoinPath(dir, manifest.shards(1).parts(1).file());
  EXPECT_EQ(manifest.shards(1).parts(1).file(), "shard-00001.part-00001");
  const std::string kept = *Env::Default()->ReadFile(part);
  auto refusal = [&] { return VerifyCheckpoint(Env::Default(), dir, "").status(); };

  std::string flipped = kept;
  flipped[flipped.size() / 2] ^= 0x20;
  ASSERT_TRUE(WriteFileAtomically(Env::Default(), part, flipped).ok());
  EXPECT_EQ(refusal().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(refusal().message()), HasSubstr("shard-00001.part-00001: CRC-32"));

  ASSERT_EQ(std::remove(part.c_str()), 0);
  EXPECT_EQ(refusal().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(refusal().message()), HasSubstr("shard-00001.part-00001"));
  absl::StatusOr<CheckpointChoice> choice = FindNewestCheckpoint(Env::Default(), root_, "");
  ASSERT_TRUE(choice.ok());
  EXPECT_FALSE(choice->manifest.has_value());
  ASSERT_TRUE(WriteFileAtomically(Env::Default(), part, kept).ok());
  ASSERT_TRUE(VerifyCheckpoint(Env::Default(), dir, "").ok());

  // A manifest that records a part's rows wrongly, or names shard 0's part
  // for shard 1.
  v1::CheckpointManifest wrong = manifest;
  wrong.mutable_shards(1)->mutable_parts(1)->set_rows(manifest.shards(1).parts(1).rows() + 1);
  ASSERT_TRUE(WriteManifest(Env::Default(), dir, wrong).ok());
  EXPECT_EQ(refusal().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(refusal().message()), HasSubstr("do not fit table 'emb'"));
  wrong = manifest;
  *wrong.mutable_shards(1)->mutable_parts(0) = manifest.shards(0).parts(0);
  ASSERT_TRUE(WriteManifest(Env::Default(), dir, wrong).ok());
  EXPECT_EQ(refusal().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(refusal().message()), HasSubstr("shard-00000.part-00000: holds job"));
}

TEST_F(SparseCheckpointTest, AnIncrementAfterOnePercentOfTheRowsChangedIsUnderFivePercent) {
  // 100,000 rows of 16 with row-wise AdaGrad on one shard; then 1,000 of
  // them (1 %) updated.
  v1::JobConfig config = SparseJob(v1::MODE_ASYNC, v1::OPTIMIZER_ADAGRAD);
  config.mutable_optimizer()->set_epsilon(1e-7f);
  config.set_num_workers(1);
  config.set_num_servers(1);
  config.set_checkpoint_dir(root_);
  config.set_checkpoint_full_every(2);
  v1::SparseTableSpec* table = config.mutable_sparse_tables(0);
  table->set_rows(1 << 20);
  table->set_dim(16);
  table->set_rowwise_adagrad(true);
  CheckpointingShards shards(root_, config);
  ShardStore& store = *shards.stores[0];
  auto push = [&](uint64_t step, int64_t first, int64_t n) {
    std::vector<int64_t> ids(n);
    for (int64_t i = 0; i < n; ++i) ids[i] = first + i * 97;  // spread over the slots
    const std::vector<float> grad(ids.size() * 16, 0.125f);
    ShardStore::SparseGradientPush g = Gradient(0, step, step, ids, grad);
    ASSERT_TRUE(store.PushSparse(std::move(g)).ok());
  };
  for (int64_t b = 0; b < 10; ++b) push(b, b, 10000);
  const v1::CheckpointManifest full = shards.Take(1);
  push(10, 3, 1000);
  const v1::CheckpointManifest delta = shards.Take(2);
  EXPECT_EQ(full.shards(0).num_rows(), 100000u);
  EXPECT_EQ(delta.shards(0).num_rows(), 1000u);
  ASSERT_EQ(delta.shards(0).chain_size(), 1);
  const double share =
      static_cast<double>(delta.shards(0).bytes()) / static_cast<double>(full.shards(0).bytes());
  std::printf("full %llu bytes, increment %llu bytes (%.2f%%)\n",
              static_cast<unsigned long long>(full.shards(0).bytes()),
              static_cast<unsigned long long>(delta.shards(0).bytes()), 100 * share);
  EXPECT_LE(share, 0.05);
  // And it reads back as the state now.
  const std::string dir = CheckpointFolder(root_, 2);
  absl::StatusOr<v1::CheckpointManifest> verified = VerifyCheckpoint(Env::Default(), dir, "");
  ASSERT_TRUE(verified.ok()) << verified.status();
  EXPECT_EQ(Restored(dir, *verified, config, 1).rows.size(), 100000u);
}

TEST_F(SparseCheckpointTest, AnIncrementWhoseBaseIsDamagedOrMissingIsRefused) {
  const v1::JobConfig config = IncrementalJob(root_, 4);
  CheckpointingShards shards(root_, config);
  for (uint64_t id = 1; id <= 3; ++id) {
    for (uint32_t k = 0; k < 2; ++k) {
      const std::vector<int64_t> ids = IdsOf(k, 5 * id);
      ASSERT_TRUE(shards.stores[k]
                      ->PushSparse(Gradient(0, id - 1, id - 1, ids,
                                            std::vector<float>(ids.size() * kDim, 0.5f)))
                      .ok());
    }
    shards.Take(id);
  }
  const std::string dir = CheckpointFolder(root_, 3);
  ASSERT_TRUE(VerifyCheckpoint(Env::Default(), dir, "").ok());
  // Checkpoint 2's file of shard 1, on which 3's applies, damaged.
  const std::string base = JoinPath(CheckpointFolder(root_, 2), ShardFileName(1));
  {
    absl::StatusOr<std::string> bytes = Env::Default()->ReadFile(base);
    ASSERT_TRUE(bytes.ok());
    (*bytes)[bytes->size() / 2] ^= 0x20;
    ASSERT_TRUE(WriteFileAtomically(Env::Default(), base, *bytes).ok());
  }
  absl::Status damaged = VerifyCheckpoint(Env::Default(), dir, "").status();
  EXPECT_EQ(damaged.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(damaged.message()), HasSubstr("ckpt-00000002/shard-00001.ckpt"));
  // Missing: NOT_FOUND; the newest complete checkpoint is then the full one.
  ASSERT_TRUE(std::filesystem::remove(base));
  EXPECT_FALSE(VerifyCheckpoint(Env::Default(), dir, "").ok());
  absl::StatusOr<CheckpointChoice> newest = FindNewestCheckpoint(Env::Default(), root_, "");
  ASSERT_TRUE(newest.ok()) << newest.status();
  ASSERT_TRUE(newest->manifest.has_value());
  EXPECT_EQ(newest->manifest->id(), 1u);
  EXPECT_EQ(newest->refused.size(), 2u);
}

TEST_F(SparseCheckpointTest, AfterARestoreTheNextCheckpointIsFull) {
  const v1::JobConfig config = IncrementalJob(root_, 4);
  CheckpointingShards shards(root_, config);
  auto push = [&](uint64_t step) {
    for (uint32_t k = 0; k < 2; ++k) {
      const std::vector<int64_t> ids = IdsOf(k, 4);
      ASSERT_TRUE(shards.stores[k]
                      ->PushSparse(
                          Gradient(0, step, step, ids, std::vector<float>(ids.size() * kDim, 0.5f)))
                      .ok());
    }
  };
  push(0);
  EXPECT_EQ(shards.Take(1).shards(0).chain_size(), 0);
  push(1);
  EXPECT_EQ(shards.Take(2).shards(0).chain_size(), 1);
  // Shard 0 rolled back to checkpoint 1: its changes since are not its
  // file of 2's; shard 1 goes on.
  absl::StatusOr<ShardState> state =
      LoadShardState(Env::Default(), CheckpointFolder(root_, 1),
                     *VerifyCheckpoint(Env::Default(), CheckpointFolder(root_, 1), ""),
                     ChunksOfShard(MapOf(config), 0), 2, 0);
  ASSERT_TRUE(state.ok()) << state.status();
  ASSERT_TRUE(shards.stores[0]->Restore(2, 1, state->chunks, {1}, state->tables).ok());
  const v1::CheckpointManifest after = shards.Take(3);
  EXPECT_EQ(after.shards(0).chain_size(), 0);
  EXPECT_EQ(after.shards(1).chain_size(), 2);
}

// What a lookup of `ids` in the job's table answers: each row found, as its
// bytes (the ids it says are missing are absent, and answered with zeros),
// and the checkpoint it answers from.
std::map<int64_t, std::string> LookedUp(const ServedRows& served,
                                        const std::vector<int64_t>& ids,
                                        uint64_t* checkpoint_id) {
  v1::LookupRequest request;
  request.set_table("emb");
  for (int64_t id : ids) request.add_ids(id);
  v1::LookupResponse response;
  std::map<int64_t, std::string> rows;
  const absl::Status s = served.Lookup(request, &response);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(response.dim(), kDim);
  EXPECT_EQ(response.values().size(), ids.size() * kDim * sizeof(float));
  if (!s.ok() || response.values().size() != ids.size() * kDim * sizeof(float)) return rows;
  *checkpoint_id = response.checkpoint_id();
  const std::set<uint32_t> missing(response.missing().begin(), response.missing().end());
  const size_t row_bytes = kDim * sizeof(float);
  for (size_t i = 0; i < ids.size(); ++i) {
    std::string row = response.values().substr(i * row_bytes, row_bytes);
    if (missing.count(static_cast<uint32_t>(i)) == 0)
      rows[ids[i]] = std::move(row);
    else
      EXPECT_EQ(row, std::string(row_bytes, '\0')) << "id " << ids[i];
  }
  return rows;
}

// The values of `rows`, by id.
std::map<int64_t, std::string> ValuesOf(const TableRows& rows) {
  std::map<int64_t, std::string> values;
  for (const auto& [id, row] : rows.rows) values[id] = std::get<0>(row);
  return values;
}

TEST_F(SparseCheckpointTest, ALookupServiceServesEachCheckpointAsARestoreReadsIt) {
  // The chain job's checkpoints (full, 3 increments, full, 2 increments),
  // served as they appear: the first and each full one read whole, each
  // increment applied on top of what is served; every lookup answers the
  // rows a restore of that checkpoint reads, and the rows evicted since as
  // missing. Its files split into parts (1 KiB), as a table of more than
  // a gigabyte a shard is.
  const v1::JobConfig config = ChainJob(root_, /*part_kib=*/1);
  CheckpointingShards shards(root_, config);
  ServedRows served(Env::Default(), root_);
  std::vector<int64_t> ids(1000);
  std::iota(ids.begin(), ids.end(), 0);
  v1::LookupRequest request;
  request.set_table("emb");
  request.add_ids(1);
  v1::LookupResponse response;
  EXPECT_EQ(served.Lookup(request, &response).code(), absl::StatusCode::kUnavailable);
  absl::StatusOr<bool> refreshed = served.Refresh();
  ASSERT_TRUE(refreshed.ok()) << refreshed.status();
  EXPECT_FALSE(*refreshed);
  uint64_t step = 0, whole = 0, increments = 0;
  for (uint64_t id = 1; id <= 7; ++id) {
    SCOPED_TRACE(absl::StrCat("checkpoint ", id));
    for (int round = 0; round < 3; ++round, ++step)
      for (uint32_t k = 0; k < 2; ++k) PushChainRound(k, step, {shards.stores[k].get()});
    const v1::CheckpointManifest manifest = shards.Take(id);
    ((id - 1) % 4 == 0 ? whole : increments) += 2;
    refreshed = served.Refresh();
    ASSERT_TRUE(refreshed.ok()) << refreshed.status();
    EXPECT_TRUE(*refreshed);
    const v1::LookupStatusResponse status = served.Status();
    EXPECT_EQ(status.checkpoint_id(), id);
    EXPECT_EQ(status.job_id(), "sparse-job");
    EXPECT_EQ(status.full_reads(), whole);
    EXPECT_EQ(status.increments_applied(), increments);
    const TableRows truth = Restored(CheckpointFolder(root_, id), manifest, config, 2);
    ASSERT_EQ(status.tables_size(), 1);
    EXPECT_EQ(status.tables(0).rows(), truth.rows.size());
    uint64_t answered_from = 0;
    EXPECT_TRUE(LookedUp(served, ids, &answered_from) == ValuesOf(truth));
    EXPECT_EQ(answered_from, id);
  }
  refreshed = served.Refresh();
  ASSERT_TRUE(refreshed.ok());
  EXPECT_FALSE(*refreshed);  // nothing newer

  // The job on 3 servers from here (as after a re-sharding): checkpoint 8,
  // full, is read whole on every shard and answered by the new placement.
  v1::JobConfig three = config;
  three.set_num_servers(3);
  CheckpointingShards resharded(root_, three);
  // Step `at` of rank 0: 20 rows a shard from id `first` on, every 7th
  // (admitted at their second update).
  auto push3 = [&](uint64_t at, int64_t first) {
    for (uint32_t k = 0; k < 3; ++k) {
      std::vector<int64_t> mine;
      for (int64_t id = first; id < 1000 && mine.size() < 20; id += 7)
        if (SparseShardOf(id, 3) == k) mine.push_back(id);
      ASSERT_TRUE(resharded.stores[k]
                      ->PushSparse(Gradient(0, at, at, mine,
                                            std::vector<float>(mine.size() * kDim, 0.25f)))
                      .ok());
    }
  };
  for (uint64_t at = 0; at < 4; ++at) push3(at, 0);
  const v1::CheckpointManifest eighth = resharded.Take(8);
  refreshed = served.Refresh();
  ASSERT_TRUE(refreshed.ok()) << refreshed.status();
  EXPECT_TRUE(*refreshed);
  EXPECT_EQ(served.Status().full_reads(), whole + 3);
  const std::map<int64_t, std::string> at_eighth =
      ValuesOf(Restored(CheckpointFolder(root_, 8), eighth, three, 3));
  uint64_t answered_from = 0;
  EXPECT_EQ(at_eighth.size(), 60u);
  EXPECT_TRUE(LookedUp(served, ids, &answered_from) == at_eighth);
  EXPECT_EQ(answered_from, 8u);

  // Checkpoint 9, an increment, damaged: not served; 8 stays, and the
  // error names the file.
  for (uint64_t at = 4; at < 6; ++at) push3(at, 3);
  const v1::CheckpointManifest ninth = resharded.Take(9);
  ASSERT_EQ(ninth.shards(2).chain_size(), 1);
  const std::string damaged = JoinPath(CheckpointFolder(root_, 9), ShardFileName(2));
  {
    absl::StatusOr<std::string> bytes = Env::Default()->ReadFile(damaged);
    ASSERT_TRUE(bytes.ok());
    (*bytes)[bytes->size() / 2] ^= 0x20;
    ASSERT_TRUE(WriteFileAtomically(Env::Default(), damaged, *bytes).ok());
  }
  refreshed = served.Refresh();
  EXPECT_EQ(refreshed.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(served.Status().checkpoint_id(), 8u);
  EXPECT_THAT(served.Status().last_error(), HasSubstr("ckpt-00000009/shard-00002.ckpt"));
  EXPECT_TRUE(LookedUp(served, ids, &answered_from) == at_eighth);
  EXPECT_EQ(answered_from, 8u);

  // What is refused: an unknown table, and a reply over 32 MiB.
  request.set_table("nope");
  absl::Status refused = served.Lookup(request, &response);
  EXPECT_EQ(refused.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(refused.message()), HasSubstr("tables: emb"));
  request.set_table("emb");
  request.mutable_ids()->Resize(static_cast<int>(kMaxLookupReplyBytes / (kDim * 4)) + 1, 0);
  EXPECT_EQ(served.Lookup(request, &response).code(), absl::StatusCode::kInvalidArgument);
  // Counted: the lookups answered (one a checkpoint served, one after the
  // damage), not those refused.
  EXPECT_EQ(served.counts().lookups, 9u);
  EXPECT_EQ(served.counts().ids, 9000u);
}

TEST(SparsePlacement, IdsSpreadEvenlyOverTheShards) {
  std::vector<int> count(4, 0);
  for (int64_t id = 0; id < 40000; ++id) ++count[SparseShardOf(id, 4)];
  for (int c : count) EXPECT_NEAR(c, 10000, 400);
}

}  // namespace
}  // namespace grps
