// Helpers of the tests that drive a whole ShardStore (shard_store_test,
// shard_checkpoint_test): a small one-shard job, its store, pushes of one
// chunk, pulls at a clock, and the values to expect.
#ifndef GRPS_SERVER_TESTING_SHARD_STORE_TEST_UTIL_H_
#define GRPS_SERVER_TESTING_SHARD_STORE_TEST_UTIL_H_

#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "job/initializer.h"
#include "job/job_config.h"
#include "job/shard_map.h"
#include "server/shard_store.h"
#include "tensor/backend.h"

namespace grps {

inline v1::TensorSpec Tensor(const std::string& name, std::vector<int64_t> shape,
                      const std::string& initializer = "glorot_uniform") {
  v1::TensorSpec t;
  t.set_name(name);
  for (int64_t d : shape) t.add_shape(d);
  t.set_initializer(initializer);
  return t;
}

// One shard, plain SGD with lr 0.5 (products stay exact in float).
inline v1::JobConfig Config(v1::ConsistencyMode mode, uint32_t workers) {
  v1::JobConfig c = DefaultJobConfig();
  c.set_mode(mode);
  c.set_num_workers(workers);
  c.set_num_servers(1);
  c.set_chunk_bytes(1024);
  v1::OptimizerConfig* opt = c.mutable_optimizer();
  opt->set_kind(v1::OPTIMIZER_SGD);
  opt->set_learning_rate(0.5f);
  opt->set_momentum(0.0f);
  return c;
}

// Tensors of 4 elements each, one chunk per tensor.
inline std::vector<v1::TensorSpec> SmallTensors(int count) {
  std::vector<v1::TensorSpec> tensors;
  for (int i = 0; i < count; ++i)
    tensors.push_back(Tensor("t" + std::to_string(i), {2, 2}));
  return tensors;
}

inline std::unique_ptr<ShardStore> MakeStore(
    const v1::JobConfig& config, const std::vector<v1::TensorSpec>& tensors,
    std::function<std::unique_ptr<Backend>()> make_backend = nullptr,
    size_t max_waiting_pulls = 0) {
  absl::StatusOr<v1::ShardMap> map =
      BuildShardMap(tensors, config.num_servers(), config.chunk_bytes());
  EXPECT_TRUE(map.ok()) << map.status();
  ShardStore::Options options;
  options.config = config;
  options.shard_map = *map;
  options.shard = 0;
  options.incarnation = 1;
  options.address = "127.0.0.1:1";
  options.make_backend = std::move(make_backend);
  options.max_waiting_pulls = max_waiting_pulls;
  absl::StatusOr<std::unique_ptr<ShardStore>> store =
      ShardStore::Create(std::move(options));
  EXPECT_TRUE(store.ok()) << store.status();
  return store.ok() ? std::move(*store) : nullptr;
}

inline std::vector<float> InitialValues(const ShardStore& store, uint32_t chunk_id) {
  const v1::ChunkSpec& spec = store.shard_map().chunks(chunk_id);
  std::vector<float> values(spec.num_elements());
  EXPECT_TRUE(InitializeRange(store.shard_map().tensors(spec.tensor_index()),
                              store.config().seed(), spec.tensor_index(),
                              spec.offset(), spec.num_elements(), values.data())
                  .ok());
  return values;
}

inline std::vector<float> Values(const ShardStore& store, uint32_t chunk_id) {
  absl::StatusOr<ShardStore::ChunkValues> v = store.TEST_ReadChunk(chunk_id);
  EXPECT_TRUE(v.ok()) << v.status();
  return v.ok() ? v->values : std::vector<float>{};
}

inline uint64_t Version(const ShardStore& store, uint32_t chunk_id) {
  absl::StatusOr<ShardStore::ChunkValues> v = store.TEST_ReadChunk(chunk_id);
  EXPECT_TRUE(v.ok()) << v.status();
  return v.ok() ? v->version : 0;
}

// A push of one chunk. Without a base version the gradient was computed on
// version `step` (a worker in lock-step).
struct Push {
  uint32_t rank = 0;
  uint64_t step = 0;
  uint32_t chunk = 0;
  std::vector<float> grad;
  std::optional<uint64_t> base_version;
  uint64_t incarnation = 1;
};

inline absl::StatusOr<ShardStore::PushResult> Send(ShardStore& store, const Push& p) {
  ShardStore::GradientPush push;
  push.worker_rank = p.rank;
  push.incarnation = p.incarnation;
  push.step = p.step;
  ShardStore::ChunkGradient& g = push.chunks.emplace_back();
  g.chunk_id = p.chunk;
  g.base_version = p.base_version.value_or(p.step);
  g.values = p.grad;
  g.wire_bytes = p.grad.size() * sizeof(float);
  return store.Push(push);
}

// p - lr * g, element by element, in float as the optimizer computes it.
inline std::vector<float> SgdStep(std::vector<float> p, const std::vector<float>& g,
                           float lr) {
  for (size_t i = 0; i < p.size(); ++i) p[i] -= lr * g[i];
  return p;
}

// A pull of every chunk by `rank` at `clock`, waiting at most `wait`.
inline absl::StatusOr<std::vector<ShardStore::PulledChunk>> PullAt(
    ShardStore& store, uint32_t rank, uint64_t clock,
    absl::Duration wait = absl::Seconds(10)) {
  ShardStore::PullSpec spec;
  spec.worker_rank = rank;
  spec.clock = clock;
  spec.deadline = absl::Now() + wait;
  return store.Pull(std::move(spec));
}

// Whether a pull by `rank` at `clock` is answered at once (it would wait
// otherwise: DEADLINE_EXCEEDED at a deadline already passed).
inline bool Readable(ShardStore& store, uint32_t rank, uint64_t clock) {
  auto pulled = PullAt(store, rank, clock, absl::ZeroDuration());
  EXPECT_TRUE(pulled.ok() || absl::IsDeadlineExceeded(pulled.status()))
      << pulled.status();
  return pulled.ok();
}

inline std::vector<float> FloatsOf(const ShardStore::PulledChunk& p) {
  std::vector<float> v(p.data.size() / sizeof(float));
  std::memcpy(v.data(), p.data.data(), p.data.size());
  return v;
}

inline v1::JobConfig SspConfig(uint32_t workers, uint32_t s) {
  v1::JobConfig c = Config(v1::MODE_SSP, workers);
  c.set_staleness_bound(s);
  return c;
}

// Rank `rank` reads at `clock` and pushes a zero gradient for it.
inline void Step(ShardStore& store, uint32_t rank, uint64_t clock) {
  auto pulled = PullAt(store, rank, clock);
  ASSERT_TRUE(pulled.ok()) << pulled.status();
  ASSERT_TRUE(
      Send(store, {rank, clock, 0, {0, 0, 0, 0}, (*pulled)[0].version}).ok());
}

}  // namespace grps

#endif  // GRPS_SERVER_TESTING_SHARD_STORE_TEST_UTIL_H_
