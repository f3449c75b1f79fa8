#include "worker/parameter_client.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <future>
#include <thread>

#include "absl/strings/str_cat.h"
#include "daemon/daemon.h"
#include "job/shard_map.h"
#include "tensor/dtype.h"

namespace grps {
namespace {

DType WireDType(v1::DType d) {
  switch (d) {
    case v1::DTYPE_F16: return DType::kF16;
    case v1::DTYPE_BF16: return DType::kBF16;
    default: return DType::kF32;
  }
}

// Waits on every future and returns the first error.
absl::Status JoinAll(std::vector<std::future<absl::Status>>& futures) {
  absl::Status first;
  for (auto& f : futures) {
    absl::Status s = f.get();
    if (first.ok() && !s.ok()) first = s;
  }
  return first;
}

}  // namespace

ParameterClient::ParameterClient(const v1::JobConfig& config,
                                 const v1::ShardMap& map, uint32_t rank,
                                 uint64_t incarnation)
    : config_(config), map_(map), rank_(rank), incarnation_(incarnation) {
  std::vector<int64_t> tensor_offset;
  for (const v1::TensorSpec& t : map_.tensors()) {
    tensor_offset.push_back(num_params_);
    num_params_ += NumElements(t);
  }
  for (const v1::ChunkSpec& c : map_.chunks())
    chunk_offset_.push_back(tensor_offset[c.tensor_index()] + c.offset());
  chunk_version_.assign(map_.chunks_size(), 0);
  shards_.resize(map_.shards_size());
  for (const v1::ShardEndpoint& e : map_.shards())
    shards_[e.shard()].stub = v1::ParameterServer::NewStub(MakeChannel(e.address()));
  for (const v1::ChunkSpec& c : map_.chunks())
    shards_[c.shard()].chunks.push_back(c.chunk_id());
}

uint64_t ParameterClient::min_pulled_version() const {
  return chunk_version_.empty()
             ? 0
             : *std::min_element(chunk_version_.begin(), chunk_version_.end());
}

absl::Status ParameterClient::Pull(uint64_t clock, absl::Duration timeout,
                                   float* host_params) {
  std::vector<std::future<absl::Status>> futures;
  for (size_t s = 0; s < shards_.size(); ++s)
    futures.push_back(std::async(std::launch::async, [=] {
      return PullShard(s, clock, timeout, host_params);
    }));
  return JoinAll(futures);
}

absl::Status ParameterClient::PullShard(size_t shard, uint64_t clock,
                                        absl::Duration timeout,
                                        float* host_params) {
  Shard& sh = shards_[shard];
  if (sh.chunks.empty()) return absl::OkStatus();
  v1::PullRequest req;
  req.set_job_id(config_.job_id());
  req.set_worker_rank(rank_);
  req.set_clock(clock);
  req.set_timeout_ms(static_cast<uint32_t>(absl::ToInt64Milliseconds(timeout)));
  req.set_dtype(config_.wire_dtype());
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout + absl::Seconds(5)));
  v1::PullResponse resp;
  grpc::Status st = sh.stub->Pull(&ctx, req, &resp);
  if (!st.ok())
    return absl::Status(ToAbsl(st).code(),
                        absl::StrCat("pull from shard ", shard, ": ", st.error_message()));
  std::vector<bool> seen(map_.chunks_size(), false);
  uint64_t bytes = 0;
  for (const v1::ChunkData& c : resp.chunks()) {
    if (c.chunk_id() >= static_cast<uint32_t>(map_.chunks_size()) ||
        map_.chunks(c.chunk_id()).shard() != shard || seen[c.chunk_id()])
      return absl::DataLossError(
          absl::StrCat("shard ", shard, " returned unexpected chunk ", c.chunk_id()));
    seen[c.chunk_id()] = true;
    const uint64_t n = map_.chunks(c.chunk_id()).num_elements();
    if (c.dtype() != v1::DTYPE_F32 && c.dtype() != v1::DTYPE_F16 &&
        c.dtype() != v1::DTYPE_BF16)
      return absl::DataLossError(absl::StrCat("chunk ", c.chunk_id(), ": bad dtype"));
    const DType d = WireDType(c.dtype());
    if (c.data().size() != n * DTypeSize(d))
      return absl::DataLossError(absl::StrCat("chunk ", c.chunk_id(), ": ",
                                              c.data().size(), " bytes, expected ",
                                              n * DTypeSize(d)));
    ConvertElements(c.data().data(), d, host_params + chunk_offset_[c.chunk_id()],
                    DType::kF32, n);
    chunk_version_[c.chunk_id()] = c.version();
    bytes += c.data().size();
  }
  for (uint32_t id : sh.chunks)
    if (!seen[id])
      return absl::DataLossError(absl::StrCat("shard ", shard, " omitted chunk ", id));
  bytes_pulled_ += bytes;
  return absl::OkStatus();
}

absl::StatusOr<ParameterClient::PushOutcome> ParameterClient::Push(
    uint64_t step, const float* host_grads, uint32_t num_samples,
    absl::Duration retry_for) {
  std::vector<PushOutcome> outcomes(shards_.size());
  std::vector<std::future<absl::Status>> futures;
  for (size_t s = 0; s < shards_.size(); ++s)
    futures.push_back(std::async(std::launch::async, [=, &outcomes] {
      return PushShard(s, step, host_grads, num_samples, retry_for, &outcomes[s]);
    }));
  if (absl::Status s = JoinAll(futures); !s.ok()) return s;
  PushOutcome total;
  for (const PushOutcome& o : outcomes) {
    total.late += o.late;
    total.too_stale += o.too_stale;
  }
  return total;
}

absl::Status ParameterClient::PushShard(size_t shard, uint64_t step,
                                        const float* host_grads,
                                        uint32_t num_samples,
                                        absl::Duration retry_for,
                                        PushOutcome* outcome) {
  Shard& sh = shards_[shard];
  if (sh.chunks.empty()) return absl::OkStatus();
  v1::PushRequest req;
  req.set_job_id(config_.job_id());
  req.set_worker_rank(rank_);
  req.set_incarnation(incarnation_);
  req.set_step(step);
  req.set_num_samples(num_samples);
  const DType d = WireDType(config_.wire_dtype());
  uint64_t bytes = 0;
  for (uint32_t id : sh.chunks) {
    const uint64_t n = map_.chunks(id).num_elements();
    v1::ChunkData* c = req.add_chunks();
    c->set_chunk_id(id);
    c->set_dtype(config_.wire_dtype() == v1::DTYPE_UNSPECIFIED ? v1::DTYPE_F32
                                                               : config_.wire_dtype());
    c->set_version(chunk_version_[id]);
    std::string* data = c->mutable_data();
    data->resize(n * DTypeSize(d));
    ConvertElements(host_grads + chunk_offset_[id], DType::kF32, data->data(), d, n);
    bytes += data->size();
  }
  Backoff policy;
  policy.initial = absl::Milliseconds(50);
  policy.give_up_after = retry_for;
  v1::PushResponse resp;
  absl::Status st = RetryTransient(policy, [&] {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    return ToAbsl(sh.stub->Push(&ctx, req, &resp));
  });
  if (!st.ok())
    return absl::Status(st.code(),
                        absl::StrCat("push to shard ", shard, ": ", st.message()));
  bytes_pushed_ += bytes;
  outcome->late = resp.late();
  outcome->too_stale = resp.too_stale();
  return absl::OkStatus();
}

}  // namespace grps
