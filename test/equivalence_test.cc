// Sync data parallelism is exact: 2 workers of batch B produce the same
// weights as 1 worker of batch 2B on the same data order, because each shard
// applies the average of the step's gradients once. And ssp with staleness
// bound 0 trains like sync: with plain SGD its per-gradient updates of lr / 2
// on the weights of the same clock add up to sync's averaged step. Runs real
// shards (the ParameterServer service over gRPC on loopback) and the
// worker's own MlpModel and ParameterClient. Gradient accumulation is exact
// the same way: k local batches of B, pushed as their mean, equal one batch
// of k x B.
#include <cmath>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/daemon.h"
#include "gtest/gtest.h"
#include "job/job_config.h"
#include "job/shard_map.h"
#include "server/parameter_server_service.h"
#include "server/shard_store.h"
#include "test/in_process_shards.h"
#include "tensor/backend.h"
#include "worker/mlp_model.h"
#include "worker/parameter_client.h"

namespace grps {
namespace {

constexpr int kFeatures = 12;
constexpr int kClasses = 4;
constexpr int kBatch = 8;   // B
constexpr int kSteps = 6;   // k

using Data = Examples;

Data MakeData(int n) { return RandomExamples(n, kFeatures, kClasses, 5); }

v1::JobConfig Config(uint32_t workers, v1::OptimizerKind optimizer,
                     v1::ConsistencyMode mode) {
  v1::JobConfig c = DefaultJobConfig();
  c.set_mode(mode);
  c.set_staleness_bound(0);
  c.set_num_servers(2);
  c.set_num_workers(workers);
  c.set_batch_size(kBatch * 2 / workers);
  c.set_input_features(kFeatures);
  c.set_num_classes(kClasses);
  c.clear_hidden_units();
  c.add_hidden_units(16);
  c.set_chunk_bytes(1024);  // several chunks per tensor, spread over shards
  c.mutable_optimizer()->set_kind(optimizer);
  c.mutable_optimizer()->set_learning_rate(0.1f);
  return c;
}

// Trains kSteps with `workers` workers; step s uses examples
// [s * 2B, (s + 1) * 2B), split evenly among the workers in rank order. A
// worker that accumulates computes its share as `accumulate` local batches
// and pushes their mean gradient (MlpModel::ComputeStaged, as the
// trainer does).
std::vector<float> Train(uint32_t workers, v1::OptimizerKind optimizer,
                         const Data& data,
                         v1::ConsistencyMode mode = v1::MODE_SYNC, int accumulate = 1) {
  v1::JobConfig config = Config(workers, optimizer, mode);
  v1::ShardMap map = *BuildShardMap(ModelTensors(config), 2, config.chunk_bytes());
  InProcessShards shards(config, &map);
  const int per_worker = 2 * kBatch / workers;
  std::vector<std::thread> threads;
  for (uint32_t rank = 0; rank < workers; ++rank) {
    threads.emplace_back([&, rank] {
      std::unique_ptr<Backend> backend = CreateCpuBackend();
      const int local = per_worker / accumulate;
      MlpModel model(backend.get(), LayerWidths(config), local);
      ParameterClient client(config, map, rank, /*incarnation=*/1);
      std::vector<float> params(client.num_parameters()), grads(params.size());
      for (int step = 0; step < kSteps; ++step) {
        const absl::Status pulled = client.Pull(step, absl::Seconds(20), params.data());
        ASSERT_TRUE(pulled.ok()) << "step " << step << ": " << pulled;
        model.SetParameters(params.data());
        // As the trainer does: each batch is staged while the one before
        // it computes, and the passes' mean lands in grads.
        const auto stage = [&](int j) {
          const int first = step * 2 * kBatch + rank * per_worker + j * local;
          model.StageBatch(j, &data.x[first * kFeatures], &data.y[first], local);
        };
        stage(0);
        for (int j = 0; j < accumulate; ++j) {
          if (j + 1 < accumulate) stage(j + 1);
          model.ComputeStaged(j, j, accumulate, 1.0f, grads.data());
        }
        model.FinishStep();
        const absl::StatusOr<ParameterClient::PushOutcome> pushed =
            client.Push(step, grads.data(), per_worker, absl::Seconds(5));
        ASSERT_TRUE(pushed.ok()) << "step " << step << ": " << pushed.status();
      }
    });
  }
  for (auto& t : threads) t.join();
  ParameterClient reader(config, map, 0, 1);
  std::vector<float> final_params(reader.num_parameters());
  absl::Status s = reader.Pull(kSteps, absl::Seconds(20), final_params.data());
  EXPECT_TRUE(s.ok()) << s;
  // Versions count updates: one per step in sync, one per gradient in ssp.
  EXPECT_EQ(reader.min_pulled_version(),
            static_cast<uint64_t>(kSteps) * (mode == v1::MODE_SYNC ? 1 : workers));
  return final_params;
}

std::vector<float> InitialWeights(v1::OptimizerKind optimizer) {
  v1::JobConfig config = Config(1, optimizer, v1::MODE_SYNC);
  v1::ShardMap map = *BuildShardMap(ModelTensors(config), 2, config.chunk_bytes());
  InProcessShards shards(config, &map);
  ParameterClient reader(config, map, 0, 1);
  std::vector<float> initial(reader.num_parameters());
  EXPECT_TRUE(reader.Pull(0, absl::Seconds(5), initial.data()).ok());
  return initial;
}

// `a` and `b` agree within float rounding, and training moved the weights
// (or the comparison proves nothing).
void ExpectSame(const std::vector<float>& a, const std::vector<float>& b,
                const std::vector<float>& initial, const std::string& what) {
  ASSERT_EQ(a.size(), b.size());
  ASSERT_EQ(a.size(), initial.size());
  double moved = 0, worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    moved = std::max(moved, std::fabs(double(a[i]) - initial[i]));
    worst = std::max(worst, std::fabs(double(a[i]) - b[i]) /
                                (1e-3 + std::fabs(double(a[i]))));
  }
  EXPECT_GT(moved, 1e-2) << "training did not change the weights";
  EXPECT_LT(worst, 1e-4) << what << " disagree";
}

void ExpectSameWeights(v1::OptimizerKind optimizer) {
  Data data = MakeData(2 * kBatch * kSteps);
  ExpectSame(Train(1, optimizer, data), Train(2, optimizer, data),
             InitialWeights(optimizer), "2 x B and 1 x 2B");
}

TEST(SyncEquivalence, TwoWorkersOfBatchBEqualOneWorkerOfBatch2BWithSgd) {
  ExpectSameWeights(v1::OPTIMIZER_SGD);
}

TEST(SyncEquivalence, TwoWorkersOfBatchBEqualOneWorkerOfBatch2BWithAdam) {
  ExpectSameWeights(v1::OPTIMIZER_ADAM);
}

TEST(SspEquivalence, SspWithBoundZeroGivesTheWeightsOfSyncWithSgd) {
  Data data = MakeData(2 * kBatch * kSteps);
  ExpectSame(Train(2, v1::OPTIMIZER_SGD, data, v1::MODE_SYNC),
             Train(2, v1::OPTIMIZER_SGD, data, v1::MODE_SSP),
             InitialWeights(v1::OPTIMIZER_SGD), "ssp(0) and sync");
}

// Gradient accumulation (JobConfig.accumulate_steps): k local batches of B
// pushed as one mean gradient train exactly as one batch of k x B.
TEST(AccumulationEquivalence, FourBatchesOfBOverFourAccumulatedEqualOneBatchOf2BWithMomentum) {
  Data data = MakeData(2 * kBatch * kSteps);
  ExpectSame(Train(1, v1::OPTIMIZER_MOMENTUM, data),
             Train(1, v1::OPTIMIZER_MOMENTUM, data, v1::MODE_SYNC, /*accumulate=*/4),
             InitialWeights(v1::OPTIMIZER_MOMENTUM), "4 accumulated x B/2 and 1 x 2B");
}

TEST(AccumulationEquivalence, TwoWorkersAccumulatingTwoBatchesEqualOneWorkerOf2BWithAdam) {
  Data data = MakeData(2 * kBatch * kSteps);
  ExpectSame(Train(1, v1::OPTIMIZER_ADAM, data),
             Train(2, v1::OPTIMIZER_ADAM, data, v1::MODE_SYNC, /*accumulate=*/2),
             InitialWeights(v1::OPTIMIZER_ADAM), "2 workers x 2 accumulated x B/2 and 1 x 2B");
}

}  // namespace
}  // namespace grps
