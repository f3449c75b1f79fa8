#include "fuzz/shard_fixture.h"

#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "fuzz/fuzz_check.h"
#include "grpcpp/support/server_callback.h"
#include "job/job_config.h"
#include "job/shard_map.h"
#include "wire/wire_format.h"

namespace grps {

v1::JobConfig ShardFuzzConfig(v1::ConsistencyMode mode) {
  v1::JobConfig c = DefaultJobConfig();
  c.set_job_id(kShardFuzzJobId);
  c.set_mode(mode);
  c.set_num_servers(2);
  c.set_num_workers(kShardFuzzWorkers);
  c.set_chunk_bytes(1024);
  v1::SparseTableSpec* table = c.add_sparse_tables();  // the sparse_push target's
  table->set_name(kShardFuzzTable);
  table->set_dim(kShardFuzzTableDim);
  table->set_rows(kShardFuzzTableRows);
  table->set_max_rows_per_shard(64);
  v1::OptimizerConfig* opt = c.mutable_optimizer();
  switch (mode) {
    case v1::MODE_ASYNC:
      opt->set_kind(v1::OPTIMIZER_ADAM);
      c.set_max_staleness(4);
      c.set_staleness_aware_lr(true);
      break;
    case v1::MODE_SSP:
      opt->set_kind(v1::OPTIMIZER_NESTEROV);
      c.set_staleness_bound(1);
      break;
    default:
      opt->set_kind(v1::OPTIMIZER_MOMENTUM);
      c.set_backup_workers(1);
      c.set_late_gradients(v1::LATE_GRADIENTS_FOLD);
  }
  return c;
}

v1::ShardMap ShardFuzzMap() {
  std::vector<v1::TensorSpec> tensors(2);
  tensors[0].set_name("w");
  tensors[0].add_shape(4);
  tensors[0].add_shape(6);
  tensors[0].set_initializer("glorot_uniform");
  tensors[1].set_name("b");
  tensors[1].add_shape(6);
  tensors[1].set_initializer("zeros");
  absl::StatusOr<v1::ShardMap> map =
      BuildShardMap(tensors, 2, kShardFuzzChunkElements * sizeof(float));
  FUZZ_CHECK(map.ok(), std::string(map.status().message()));
  const std::vector<uint32_t> mine = ChunksOfShard(*map, 0);
  FUZZ_CHECK((mine == std::vector<uint32_t>{0, 2}),
             "the fixture's layout moved: shard 0 no longer holds chunks 0 and 2");
  return *map;
}

namespace {

// The call side of a handler's reactor, as gRPC's callback server provides
// it: the reactor is bound to it once the handler has returned (a Finish
// the handler already asked for arrives then), and it records the status.
// Whoever may call Finish (the store's threads) must be gone before it is
// destroyed.
class RecordingCall final : public grpc::ServerCallbackUnary {
 public:
  void Bind(grpc::ServerUnaryReactor* reactor) {
    reactor_ = reactor;
    BindReactor(reactor);
  }
  void Finish(grpc::Status status) override {
    absl::MutexLock lock(&mu_);
    status_ = std::move(status);
    finished_ = true;
  }
  void SendInitialMetadata() override {}

  // True once Finish has been called; waits up to `timeout` for it.
  bool WaitForFinish(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(absl::Condition(&finished_), timeout);
  }
  grpc::Status status() {
    absl::MutexLock lock(&mu_);
    return status_;
  }
  // The end of the call: gRPC calls the reactor's OnDone after Finish (a
  // reactor the handler allocated frees itself there).
  void Done() { reactor_->OnDone(); }

 private:
  grpc::internal::ServerReactor* reactor() override { return reactor_; }
  void CallOnDone() override { Done(); }

  grpc::ServerUnaryReactor* reactor_ = nullptr;
  absl::Mutex mu_;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<ShardStore> NewFuzzShard(v1::ConsistencyMode mode) {
  static const v1::ShardMap* const map = new v1::ShardMap(ShardFuzzMap());
  ShardStore::Options options;
  options.config = ShardFuzzConfig(mode);
  options.shard_map = *map;
  options.shard = 0;
  options.incarnation = 1;
  options.address = "127.0.0.1:1";
  options.generation = kShardFuzzGeneration;
  absl::StatusOr<std::unique_ptr<ShardStore>> store = ShardStore::Create(std::move(options));
  FUZZ_CHECK(store.ok(), std::string(store.status().message()));
  return std::move(*store);
}

ShardCallResult CallShard(v1::ConsistencyMode mode,
                          const std::function<void(ShardStore&)>& prepare,
                          RawHandler handler, const grpc::ByteBuffer& request,
                          absl::Duration grace) {
  // Declared before the store, so destroyed after it: the store's timer
  // thread may be the one that finishes the call.
  grpc::CallbackServerContext context;
  RecordingCall call;
  ShardCallResult result;
  std::unique_ptr<ShardStore> store = NewFuzzShard(mode);
  if (prepare) prepare(*store);
  {
    ParameterServerService service(store.get());
    call.Bind((service.*handler)(&context, &request, &result.response));
    if (grace > absl::ZeroDuration()) call.WaitForFinish(grace);
    store->Shutdown();
    FUZZ_CHECK(call.WaitForFinish(absl::Seconds(5)),
               "the handler did not finish within 5 s of the store's shutdown");
  }
  store.reset();  // joins the store's threads
  call.Done();
  result.status = call.status();
  return result;
}

absl::Duration GraceFor(uint32_t timeout_ms) {
  if (timeout_ms == 0 || timeout_ms > kShortWaitMs) return absl::ZeroDuration();
  return absl::Milliseconds(timeout_ms + 1);
}

grpc::ByteBuffer OneSlice(const uint8_t* data, size_t size) {
  grpc::Slice slice(data, size);
  return grpc::ByteBuffer(&slice, 1);
}

grpc::ByteBuffer ManySlices(const uint8_t* data, size_t size) {
  std::vector<grpc::Slice> slices;
  for (size_t at = 0; at < size;) {
    const size_t length = std::min<size_t>(size - at, 1 + data[at] % 16);
    slices.emplace_back(data + at, length);
    at += length;
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

std::string Flatten(const grpc::ByteBuffer& buffer) { return BufferBytes(buffer); }

}  // namespace grps
