#include "worker/sparse_client.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "daemon/daemon.h"
#include "job/sparse_tables.h"
#include "tensor/dtype.h"
#include "wire/chunk_codec.h"

namespace grps {
namespace {

// The methods, called with raw bytes (wire/chunk_codec.h): the gradients go
// from where they were gathered, the rows are scattered straight from
// gRPC's slices.
constexpr char kPushSparseMethod[] = "/grps.v1.ParameterServer/PushSparse";
constexpr char kPullSparseMethod[] = "/grps.v1.ParameterServer/PullSparse";

// Whether a failed call is worth sending again (the shards deduplicate a
// push sent twice). UNAVAILABLE: the shard is down or not restored yet.
// RESOURCE_EXHAUSTED: its gRPC is short of memory for calls. CANCELLED: its
// server cancelled the call as it went away (a shard a re-sharding retired,
// before this worker hears of the move: the roll-back that comes with the
// next heartbeat reply stops the retries, retry.stop).
bool Transient(const grpc::Status& s) {
  return s.error_code() == grpc::StatusCode::UNAVAILABLE ||
         s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED ||
         s.error_code() == grpc::StatusCode::CANCELLED;
}

// Runs `start(shard, done)` for every shard in `shards` at once and waits
// until each has called done. (A std::mutex, not absl::BlockingCounter:
// ThreadSanitizer sees the hand-off of what the calls wrote only through
// synchronization it instruments, and Debian's Abseil is not instrumented.)
void ForEachShardAtOnce(absl::Span<const size_t> shards,
                        const std::function<void(size_t, std::function<void()>)>& start) {
  std::mutex mu;
  std::condition_variable all_done;
  size_t pending = shards.size();
  for (size_t s : shards)
    start(s, [&] {
      std::lock_guard<std::mutex> lock(mu);
      if (--pending == 0) all_done.notify_all();
    });
  std::unique_lock<std::mutex> lock(mu);
  all_done.wait(lock, [&] { return pending == 0; });
}

}  // namespace

SparseClient::SparseClient(const v1::JobConfig& config, const v1::ShardMap& map,
                           uint32_t rank, uint64_t incarnation)
    : config_(config),
      rank_(rank),
      incarnation_(incarnation),
      shards_(static_cast<uint32_t>(map.shards_size())) {
  for (const v1::SparseTableSpec& spec : config_.sparse_tables()) {
    auto t = std::make_unique<TableState>();
    t->spec = spec;
    t->versions = std::vector<std::atomic<uint64_t>>(shards_);
    tables_.push_back(std::move(t));
  }
  absl::MutexLock lock(&mu_);
  addresses_.assign(shards_, "");
  stubs_.assign(shards_, nullptr);
  for (const v1::ShardEndpoint& e : map.shards()) {
    if (e.shard() >= shards_) continue;
    addresses_[e.shard()] = e.address();
    stubs_[e.shard()] = std::make_shared<grpc::GenericStub>(MakeChannel(e.address()));
  }
}

void SparseClient::UpdateShardMap(const v1::ShardMap& map) {
  absl::MutexLock lock(&mu_);
  for (const v1::ShardEndpoint& e : map.shards()) {
    if (e.shard() >= shards_ || e.address().empty()) continue;
    // A fresh channel also for the same address: the old one may sit in
    // gRPC's reconnect backoff after the shard's process died.
    addresses_[e.shard()] = e.address();
    stubs_[e.shard()] = std::make_shared<grpc::GenericStub>(MakeChannel(e.address()));
  }
}

std::shared_ptr<grpc::GenericStub> SparseClient::StubOf(size_t shard) const {
  absl::MutexLock lock(&mu_);
  return stubs_[shard];
}

absl::StatusOr<SparseClient::TableState*> SparseClient::Find(const std::string& table) {
  for (const std::unique_ptr<TableState>& t : tables_)
    if (t->spec.name() == table) return t.get();
  return absl::NotFoundError(absl::StrCat("the job has no sparse table '", table, "'"));
}

void SparseClient::Split(absl::Span<const int64_t> ids, TableState* t) const {
  std::vector<std::vector<size_t>>& by_shard = t->by_shard;
  if (by_shard.size() == shards_ && t->split_ids.size() == ids.size() &&
      std::equal(ids.begin(), ids.end(), t->split_ids.begin()))
    return;
  t->split_ids.assign(ids.begin(), ids.end());
  by_shard.resize(shards_);
  for (std::vector<size_t>& rows : by_shard) rows.clear();
  for (size_t i = 0; i < ids.size(); ++i) by_shard[SparseShardOf(ids[i], shards_)].push_back(i);
}

absl::Status SparseClient::Pull(const std::string& table, absl::Span<const int64_t> ids,
                                uint64_t clock, absl::Duration timeout, float* out,
                                PullProgress* progress) {
  absl::StatusOr<TableState*> t = Find(table);
  if (!t.ok()) return t.status();
  const uint32_t dim = (*t)->spec.dim();
  Split(ids, *t);
  const std::vector<std::vector<size_t>>& by_shard = (*t)->by_shard;
  absl::StatusOr<DType> wire = DTypeFromWire(config_.wire_dtype(), true, "wire_dtype");
  if (!wire.ok()) return wire.status();
  // Each shard's rows go in parts whose replies stay far below gRPC's
  // message limit (a quarter of it), all parts of all shards at once.
  struct Part {
    size_t shard;
    size_t begin, end;  // into by_shard[shard]
  };
  const size_t part_rows = std::max<size_t>(
      1, static_cast<size_t>(kMaxMessageBytes / 4) / (static_cast<size_t>(dim) * DTypeSize(*wire)));
  std::vector<Part> parts;
  for (size_t s = 0; s < shards_; ++s) {
    size_t begin = 0;
    do {  // every shard at least once, even with no rows (its version)
      const size_t end = std::min(by_shard[s].size(), begin + part_rows);
      parts.push_back(Part{s, begin, end});
      begin = end;
    } while (begin < by_shard[s].size());
  }
  struct Call {
    grpc::ClientContext context;
    grpc::Status status;
    std::shared_ptr<grpc::GenericStub> stub;
    grpc::ByteBuffer request;
    grpc::ByteBuffer reply;
  };
  std::vector<Call> calls(parts.size());
  std::vector<v1::SparsePullRequest>& requests = (*t)->pull_requests;
  requests.resize(parts.size());
  PullProgress own;
  PullProgress& done = progress != nullptr ? *progress : own;
  if (done.read.size() != parts.size()) {
    done.read.assign(parts.size(), false);
    done.versions.assign(parts.size(), 0);
  }
  std::vector<size_t> todo;
  for (size_t p = 0; p < parts.size(); ++p)
    if (!done.read[p]) todo.push_back(p);
  const uint32_t timeout_ms =
      static_cast<uint32_t>(std::max<int64_t>(0, absl::ToInt64Milliseconds(timeout)));
  ForEachShardAtOnce(todo, [&](size_t p, std::function<void()> call_done) {
    Call& c = calls[p];
    const Part& part = parts[p];
    v1::SparsePullRequest& request = requests[p];
    request.Clear();  // keeps its ids' room
    request.set_job_id(config_.job_id());
    request.set_worker_rank(rank_);
    request.set_table(table);
    request.mutable_ids()->Resize(static_cast<int>(part.end - part.begin), 0);
    int64_t* part_ids = request.mutable_ids()->mutable_data();
    for (size_t j = part.begin; j < part.end; ++j)
      part_ids[j - part.begin] = ids[by_shard[part.shard][j]];
    request.set_dtype(config_.wire_dtype());
    request.set_clock(clock);
    request.set_generation(generation_.load());
    request.set_timeout_ms(timeout_ms);
    // The call's own deadline leaves the shard time to answer after its wait.
    c.context.set_deadline(absl::ToChronoTime(absl::Now() + timeout + absl::Seconds(10)));
    c.stub = StubOf(part.shard);
    bool own_buffer;
    if (grpc::Status s = grpc::SerializationTraits<v1::SparsePullRequest>::Serialize(
            request, &c.request, &own_buffer);
        !s.ok()) {
      c.status = std::move(s);
      call_done();
      return;
    }
    StartUnaryCall(
        [&](grpc::ClientUnaryReactor* r) {
          c.stub->PrepareUnaryCall(&c.context, kPullSparseMethod, grpc::StubOptions(), &c.request,
                                   &c.reply, r);
        },
        [&c, call_done](grpc::Status status) {
          c.status = std::move(status);
          call_done();
        });
  });
  // Every part that came goes into `out` (and `done`), also when others
  // failed: the next attempt reads only those.
  absl::Status failed;
  for (size_t p : todo) {
    Call& c = calls[p];
    const Part& part = parts[p];
    const size_t s = part.shard;
    if (!c.status.ok()) {
      if (failed.ok())
        failed = absl::Status(ToAbsl(c.status).code(),
                              absl::StrCat("shard ", s, ": ", c.status.error_message()));
      continue;
    }
    v1::SparsePullResponse response;  // its dtype and version
    SliceReader values;
    if (absl::Status st = DecodeSparsePullResponse(c.reply, &response, &values); !st.ok())
      return absl::InternalError(absl::StrCat("shard ", s, "'s sparse pull reply: ", st.message()));
    absl::StatusOr<DType> dtype = DTypeFromWire(response.dtype(), true, "sparse pull reply");
    if (!dtype.ok()) return dtype.status();
    const size_t rows_in_part = part.end - part.begin;
    const size_t n = rows_in_part * dim;
    if (values.left() != n * DTypeSize(*dtype))
      return absl::InternalError(absl::StrCat("shard ", s, " sent ", values.left(), " bytes for ",
                                              rows_in_part, " rows of ", dim));
    const size_t row_bytes = dim * sizeof(float);
    const size_t* rows = by_shard[s].data() + part.begin;
    if (*dtype == DType::kF32) {
      // Each row from gRPC's slices to its place in `out`: the one copy.
      for (size_t j = 0; j < rows_in_part; ++j)
        if (absl::Status st = values.ReadBytes(out + rows[j] * dim, row_bytes); !st.ok()) return st;
    } else {
      thread_local std::string wire_bytes;
      thread_local std::vector<float> converted;
      converted.resize(n);
      if (absl::Status st = ReadValues(values, *dtype, converted.data(), n, &wire_bytes); !st.ok())
        return st;
      for (size_t j = 0; j < rows_in_part; ++j)
        std::memcpy(out + rows[j] * dim, converted.data() + j * dim, row_bytes);
    }
    done.read[p] = true;
    done.versions[p] = response.version();
    bytes_pulled_.fetch_add(c.reply.Length());
  }
  if (!failed.ok()) return failed;
  // A shard's version: the lowest of its parts' (a push computed on these
  // rows counts its staleness from the oldest).
  std::vector<uint64_t> versions(shards_, UINT64_MAX);
  for (size_t p = 0; p < parts.size(); ++p)
    versions[parts[p].shard] = std::min(versions[parts[p].shard], done.versions[p]);
  for (size_t s = 0; s < shards_; ++s) (*t)->versions[s].store(versions[s]);
  return absl::OkStatus();
}

absl::StatusOr<SparseClient::PushOutcome> SparseClient::Push(
    const std::string& table, uint64_t step, absl::Span<const int64_t> ids, const float* grads,
    const ParameterClient::RetryPolicy& retry) {
  absl::StatusOr<TableState*> t = Find(table);
  if (!t.ok()) return t.status();
  const uint32_t dim = (*t)->spec.dim();
  const DType dtype = *DTypeFromWire(config_.wire_dtype(), true, "wire_dtype");
  Split(ids, *t);
  const std::vector<std::vector<size_t>>& by_shard = (*t)->by_shard;
  std::vector<std::string>& packed_ids = (*t)->push_ids;
  std::vector<std::string>& gradients = (*t)->push_gradients;
  packed_ids.resize(shards_);
  gradients.resize(shards_);
  std::vector<grpc::ByteBuffer> requests(shards_);
  thread_local std::vector<int64_t> shard_ids;
  for (size_t s = 0; s < shards_; ++s) {
    v1::SparsePushRequest header;  // no ids, no gradients
    header.set_job_id(config_.job_id());
    header.set_worker_rank(rank_);
    header.set_incarnation(incarnation_);
    header.set_step(step);
    header.set_table(table);
    header.set_dtype(DTypeToWire(dtype));
    header.set_version((*t)->versions[s].load());
    header.set_generation(generation_.load());
    const std::vector<size_t>& rows = by_shard[s];
    const size_t row_bytes = dim * DTypeSize(dtype);
    // Gathered once, into buffers the request is sent from (kept for a
    // retry, and for the next step's room).
    gradients[s].resize(rows.size() * row_bytes);
    shard_ids.resize(rows.size());
    char* dst = gradients[s].data();
    for (size_t j = 0; j < rows.size(); ++j, dst += row_bytes) {
      shard_ids[j] = ids[rows[j]];
      ConvertElements(grads + rows[j] * dim, DType::kF32, dst, dtype, dim);  // f32: a copy
    }
    PackVarints(shard_ids, &packed_ids[s]);
    requests[s] = EncodeSparsePushRequest(header, packed_ids[s], gradients[s]);
  }
  std::vector<grpc::ByteBuffer> replies(shards_);
  std::vector<v1::SparsePushResponse> responses(shards_);
  std::vector<grpc::Status> statuses(shards_);
  std::vector<size_t> todo(shards_);
  for (size_t s = 0; s < shards_; ++s) todo[s] = s;
  const absl::Time give_up = absl::Now() + retry.retry_for;
  absl::Duration backoff = retry.initial_backoff;
  PushOutcome outcome;
  RetryNotice notice;
  while (true) {
    std::vector<std::unique_ptr<grpc::ClientContext>> contexts(shards_);
    std::vector<std::shared_ptr<grpc::GenericStub>> stubs(shards_);
    ForEachShardAtOnce(todo, [&](size_t s, std::function<void()> done) {
      contexts[s] = std::make_unique<grpc::ClientContext>();
      contexts[s]->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
      stubs[s] = StubOf(s);
      StartUnaryCall(
          [&](grpc::ClientUnaryReactor* r) {
            stubs[s]->PrepareUnaryCall(contexts[s].get(), kPushSparseMethod, grpc::StubOptions(),
                                       &requests[s], &replies[s], r);
          },
          [&statuses, s, done](grpc::Status status) {
            statuses[s] = std::move(status);
            done();
          });
    });
    std::vector<size_t> again;
    for (size_t s : todo) {
      grpc::Status& st = statuses[s];
      if (st.ok())
        st = grpc::SerializationTraits<v1::SparsePushResponse>::Deserialize(&replies[s],
                                                                            &responses[s]);
      if (st.ok()) {
        bytes_pushed_.fetch_add(requests[s].Length());
        outcome.duplicates += responses[s].duplicate();
        outcome.late += responses[s].late();
        outcome.too_stale += responses[s].too_stale();
      } else if (Transient(st)) {
        again.push_back(s);
      } else {
        return absl::Status(ToAbsl(st).code(),
                            absl::StrCat("shard ", s, ": ", st.error_message()));
      }
    }
    if (again.empty()) return outcome;
    const grpc::Status& first = statuses[again.front()];
    if (absl::Now() + backoff > give_up)
      return absl::Status(ToAbsl(first).code(),
                          absl::StrCat("shard ", again.front(), ": ", first.error_message()));
    notice.Refused(absl::StrCat("a push of table '", table, "' to shard ", again.front()),
                   ToAbsl(first));
    if (!SleepUnlessStopped(backoff, retry.stop))
      return absl::CancelledError(
          absl::StrCat("gave up retrying (", first.error_message(), ")"));
    backoff = std::min(backoff * 2, retry.max_backoff);
    todo = std::move(again);
  }
}

}  // namespace grps
