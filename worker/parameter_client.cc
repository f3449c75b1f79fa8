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

bool SameChunk(const v1::ChunkSpec& a, const v1::ChunkSpec& b) {
  return a.chunk_id() == b.chunk_id() && a.tensor_index() == b.tensor_index() &&
         a.offset() == b.offset() && a.num_elements() == b.num_elements() &&
         a.shard() == b.shard();
}

bool SameTensor(const v1::TensorSpec& a, const v1::TensorSpec& b) {
  return a.name() == b.name() &&
         std::equal(a.shape().begin(), a.shape().end(), b.shape().begin(),
                    b.shape().end());
}

// Sleeps `d` in short slices; returns false (early) once `stop` or a signal
// says to give up.
bool SleepUnlessStopped(absl::Duration d, const std::function<bool()>& stop) {
  const absl::Time until = absl::Now() + d;
  while (true) {
    if (ShutdownRequested() || (stop && stop())) return false;
    const absl::Duration left = until - absl::Now();
    if (left <= absl::ZeroDuration()) return true;
    absl::SleepFor(std::min(left, absl::Milliseconds(10)));
  }
}

}  // namespace

ParameterClient::ParameterClient(const v1::JobConfig& config,
                                 const v1::ShardMap& map, uint32_t rank,
                                 uint64_t incarnation)
    : config_(config), layout_(map), rank_(rank), incarnation_(incarnation) {
  std::vector<int64_t> tensor_offset;
  for (const v1::TensorSpec& t : layout_.tensors()) {
    tensor_offset.push_back(num_params_);
    num_params_ += NumElements(t);
  }
  for (const v1::ChunkSpec& c : layout_.chunks())
    chunk_offset_.push_back(tensor_offset[c.tensor_index()] + c.offset());
  chunk_version_.assign(layout_.chunks_size(), 0);
  shard_chunks_.resize(layout_.shards_size());
  for (const v1::ChunkSpec& c : layout_.chunks())
    shard_chunks_[c.shard()].push_back(c.chunk_id());
  absl::MutexLock lock(&mu_);
  endpoints_.resize(layout_.shards_size());
  stubs_.resize(layout_.shards_size());
  for (const v1::ShardEndpoint& e : layout_.shards()) {
    endpoints_[e.shard()] = e;
    stubs_[e.shard()] = v1::ParameterServer::NewStub(MakeChannel(e.address()));
  }
  epoch_ = layout_.epoch();
}

absl::Status ParameterClient::CheckCompatible(const v1::ShardMap& map) const {
  if (absl::Status s = ValidateShardMap(map); !s.ok())
    return absl::InvalidArgumentError(
        absl::StrCat("shard map epoch ", map.epoch(), ": ", s.message()));
  if (map.tensors_size() != layout_.tensors_size() ||
      map.chunks_size() != layout_.chunks_size() ||
      map.shards_size() != layout_.shards_size())
    return absl::InvalidArgumentError(absl::StrCat(
        "shard map epoch ", map.epoch(), " has ", map.tensors_size(), " tensors, ",
        map.chunks_size(), " chunks and ", map.shards_size(),
        " shards; the job's map has ", layout_.tensors_size(), ", ",
        layout_.chunks_size(), " and ", layout_.shards_size()));
  for (int i = 0; i < map.tensors_size(); ++i)
    if (!SameTensor(map.tensors(i), layout_.tensors(i)))
      return absl::InvalidArgumentError(absl::StrCat(
          "shard map epoch ", map.epoch(), ": tensor ", i, " differs"));
  for (int i = 0; i < map.chunks_size(); ++i)
    if (!SameChunk(map.chunks(i), layout_.chunks(i)))
      return absl::InvalidArgumentError(absl::StrCat(
          "shard map epoch ", map.epoch(), ": chunk ", i,
          " is cut or placed differently"));
  std::vector<bool> seen(map.shards_size(), false);
  for (const v1::ShardEndpoint& e : map.shards()) {
    if (e.shard() >= seen.size() || seen[e.shard()])
      return absl::InvalidArgumentError(absl::StrCat(
          "shard map epoch ", map.epoch(), ": bad or repeated endpoint of shard ",
          e.shard()));
    seen[e.shard()] = true;
    if (e.address().empty())
      return absl::InvalidArgumentError(absl::StrCat(
          "shard map epoch ", map.epoch(), " has no address for shard ", e.shard()));
  }
  return absl::OkStatus();
}

absl::Status ParameterClient::UpdateShardMap(const v1::ShardMap& map) {
  if (absl::Status s = CheckCompatible(map); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  for (const v1::ShardEndpoint& e : map.shards()) {
    v1::ShardEndpoint& known = endpoints_[e.shard()];
    if (known.address() == e.address() && known.incarnation() == e.incarnation())
      continue;
    // A fresh channel also for the same address: the old one may sit in
    // gRPC's reconnect backoff after the shard's process died.
    stubs_[e.shard()] = v1::ParameterServer::NewStub(MakeChannel(e.address()));
    known = e;
  }
  epoch_ = map.epoch();
  return absl::OkStatus();
}

uint64_t ParameterClient::map_epoch() const {
  absl::MutexLock lock(&mu_);
  return epoch_;
}

std::shared_ptr<v1::ParameterServer::Stub> ParameterClient::StubOf(
    size_t shard) const {
  absl::MutexLock lock(&mu_);
  return stubs_[shard];
}

uint64_t ParameterClient::min_pulled_version() const {
  return chunk_version_.empty()
             ? 0
             : *std::min_element(chunk_version_.begin(), chunk_version_.end());
}

absl::Status ParameterClient::Pull(uint64_t clock, absl::Duration timeout,
                                   float* host_params) {
  std::vector<std::future<absl::Status>> futures;
  for (size_t s = 0; s < shard_chunks_.size(); ++s)
    futures.push_back(std::async(std::launch::async, [=] {
      return PullShard(s, clock, timeout, host_params);
    }));
  return JoinAll(futures);
}

absl::Status ParameterClient::PullShard(size_t shard, uint64_t clock,
                                        absl::Duration timeout,
                                        float* host_params) {
  const std::vector<uint32_t>& own = shard_chunks_[shard];
  if (own.empty()) return absl::OkStatus();
  v1::PullRequest req;
  req.set_job_id(config_.job_id());
  req.set_worker_rank(rank_);
  req.set_clock(clock);
  req.set_timeout_ms(static_cast<uint32_t>(absl::ToInt64Milliseconds(timeout)));
  req.set_dtype(config_.wire_dtype());
  req.set_generation(generation_.load());
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout + absl::Seconds(5)));
  v1::PullResponse resp;
  grpc::Status st = StubOf(shard)->Pull(&ctx, req, &resp);
  if (!st.ok())
    return absl::Status(ToAbsl(st).code(),
                        absl::StrCat("pull from shard ", shard, ": ", st.error_message()));
  std::vector<bool> seen(layout_.chunks_size(), false);
  uint64_t bytes = 0;
  for (const v1::ChunkData& c : resp.chunks()) {
    if (c.chunk_id() >= static_cast<uint32_t>(layout_.chunks_size()) ||
        layout_.chunks(c.chunk_id()).shard() != shard || seen[c.chunk_id()])
      return absl::DataLossError(
          absl::StrCat("shard ", shard, " returned unexpected chunk ", c.chunk_id()));
    seen[c.chunk_id()] = true;
    const uint64_t n = layout_.chunks(c.chunk_id()).num_elements();
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
  for (uint32_t id : own)
    if (!seen[id])
      return absl::DataLossError(absl::StrCat("shard ", shard, " omitted chunk ", id));
  bytes_pulled_ += bytes;
  return absl::OkStatus();
}

absl::StatusOr<ParameterClient::PushOutcome> ParameterClient::Push(
    uint64_t step, const float* host_grads, uint32_t num_samples,
    absl::Duration retry_for) {
  RetryPolicy retry;
  retry.retry_for = retry_for;
  return Push(step, host_grads, num_samples, retry);
}

absl::StatusOr<ParameterClient::PushOutcome> ParameterClient::Push(
    uint64_t step, const float* host_grads, uint32_t num_samples,
    const RetryPolicy& retry) {
  std::vector<PushOutcome> outcomes(shard_chunks_.size());
  std::vector<std::future<absl::Status>> futures;
  for (size_t s = 0; s < shard_chunks_.size(); ++s)
    futures.push_back(std::async(std::launch::async, [=, &retry, &outcomes] {
      return PushShard(s, step, host_grads, num_samples, retry, &outcomes[s]);
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
                                        const RetryPolicy& retry,
                                        PushOutcome* outcome) {
  const std::vector<uint32_t>& own = shard_chunks_[shard];
  if (own.empty()) return absl::OkStatus();
  v1::PushRequest req;
  req.set_job_id(config_.job_id());
  req.set_worker_rank(rank_);
  req.set_incarnation(incarnation_);
  req.set_step(step);
  req.set_num_samples(num_samples);
  req.set_generation(generation_.load());
  const DType d = WireDType(config_.wire_dtype());
  uint64_t bytes = 0;
  for (uint32_t id : own) {
    const uint64_t n = layout_.chunks(id).num_elements();
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
  const absl::Time give_up = absl::Now() + retry.retry_for;
  absl::Duration backoff = retry.initial_backoff;
  v1::PushResponse resp;
  absl::Status st;
  while (true) {
    // Each attempt asks for the stub again: a map update since the last
    // attempt sends this one to the shard's new endpoint.
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    st = ToAbsl(StubOf(shard)->Push(&ctx, req, &resp));
    if (!absl::IsUnavailable(st) || absl::Now() + backoff > give_up) break;
    if (!SleepUnlessStopped(backoff, retry.stop)) {
      st = absl::CancelledError(absl::StrCat("gave up retrying (", st.message(), ")"));
      break;
    }
    backoff = std::min(backoff * 2, retry.max_backoff);
  }
  if (!st.ok())
    return absl::Status(st.code(),
                        absl::StrCat("push to shard ", shard, ": ", st.message()));
  bytes_pushed_ += bytes;
  outcome->late = resp.late();
  outcome->too_stale = resp.too_stale();
  return absl::OkStatus();
}

}  // namespace grps
