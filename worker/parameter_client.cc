// ParameterClient: tickets of pushes and pulls, their calls over gRPC or at
// a lane's doorbell, and their retries. Its collaborators: the chunks'
// layout (chunk_layout.h), the push schedule (push_schedule.h), the lanes
// (push_lanes.h), the part codec (part_codec.h), top-k (topk_feedback.h)
// and the optimizer-state calls (optimizer_state_calls.h).
#include "worker/parameter_client.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <limits>
#include <mutex>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/daemon.h"
#include "spdlog/spdlog.h"
#include "tensor/dtype.h"
#include "wire/chunk_codec.h"
#include "worker/part_codec.h"

namespace grps {
namespace {

constexpr char kPushMethod[] = "/grps.v1.ParameterServer/Push";
constexpr char kPullMethod[] = "/grps.v1.ParameterServer/Pull";

// f32 when the job leaves the wire dtype unspecified.
v1::DType JobWireDType(const v1::JobConfig& config) {
  return config.wire_dtype() == v1::DTYPE_UNSPECIFIED ? v1::DTYPE_F32 : config.wire_dtype();
}

// PushSchedule::LeastCredit of the shards whose `local` is `on_this_machine`.
size_t LeastCreditOf(const ChunkLayout& layout, const std::vector<bool>& local,
                     bool on_this_machine) {
  const std::vector<size_t> largest = layout.LargestPartBytes();
  std::vector<size_t> these;
  for (size_t s = 0; s < largest.size(); ++s)
    if ((s < local.size() && local[s]) == on_this_machine) these.push_back(largest[s]);
  return PushSchedule::LeastCredit(these);
}

}  // namespace

bool SleepUnlessStopped(absl::Duration d, const std::function<bool()>& stop) {
  const absl::Time until = absl::Now() + d;
  while (true) {
    if (ShutdownRequested() || (stop && stop())) return false;
    const absl::Duration left = until - absl::Now();
    if (left <= absl::ZeroDuration()) return true;
    absl::SleepFor(std::min(left, absl::Milliseconds(10)));
  }
}

void RetryNotice::Refused(absl::string_view what, const absl::Status& why) {
  const absl::Time now = now_();
  if (!since_.has_value()) since_ = now;
  if (now - *since_ < kSayAfter || now - said_ < kSayAfter) return;
  spdlog::warn("{} has been refused for {} and is sent again: {}", std::string(what),
               absl::FormatDuration(absl::Trunc(now - *since_, absl::Seconds(1))),
               std::string(why.ToString()));
  said_ = now;
}

// One call of an operation: a request to one shard, its reply, its status.
struct ParameterClient::Call {
  const Part* part = nullptr;
  bool pulled = false;  // its reply carried every chunk's values
  // A pull's part read at the pull's clock already (ReadSoFar): not called.
  bool read_before = false;
  // The lane whose place for the part this push holds, or null: bytes.
  std::shared_ptr<PushLane> lane;
  // Rung at the lane's doorbell (not called through gRPC), with this
  // sequence, at this time; completed by the thread that waits for it.
  bool rung = false;
  uint32_t seq = 0;
  absl::Time rung_at;
  uint64_t lane_bytes = 0;  // gradient bytes it put in the lane
  std::unique_ptr<grpc::ClientContext> context;  // fresh for every attempt
  std::shared_ptr<grpc::GenericStub> stub;       // alive while the call is
  grpc::ByteBuffer request;
  grpc::ByteBuffer reply;
  absl::Status status;
};

// What a ticket names: every call of one push or pull. The waiter frees it
// once `outstanding` is 0, possibly while the callback that set it is still
// unlocking `mu`: std::mutex and std::condition_variable allow that (the
// pattern of gRPC's callback examples), so they are used here.
struct ParameterClient::Operation {
  bool push = false;
  // A push: what every call is encoded from (again, for a retry).
  v1::PushRequest header;  // no chunks, no lane
  // The program's optimizers (in header) and each chunk's; null: the job's.
  std::shared_ptr<const ProgramOptimizers> optimizers;
  const float* host_grads = nullptr;
  DType dtype = DType::kF32;  // of the values on the wire
  float* host_params = nullptr;  // pull, fused push: where the values go
  // The clock the values are read at (a fused push's: step + 1) and the
  // generation the calls carry.
  uint64_t read_clock = 0;
  uint64_t read_generation = 0;
  absl::Time deadline;           // pull: of every attempt
  std::vector<Call> calls;       // a call's status is guarded by mu
  // A staged push (StagePush): which parts started, and how many of each
  // part's chunks still wait for their tensor; which tensors are ready.
  bool staged = false;
  std::vector<bool> started;
  std::vector<uint32_t> waiting_chunks;
  std::vector<bool> tensor_ready;
  // The push schedule of the calls whose bytes travel in the request,
  // with the client's credit when the operation started.
  std::unique_ptr<PushSchedule> schedule;
  std::mutex mu;
  std::condition_variable done;
  int outstanding = 0;   // guarded by mu
  PushOutcome outcome;   // guarded by mu

  void AwaitCalls() {
    std::unique_lock<std::mutex> lock(mu);
    done.wait(lock, [this] { return outstanding == 0; });
  }
};

ParameterClient::ParameterClient(const v1::JobConfig& config, const v1::ShardMap& map,
                                 uint32_t rank, uint64_t incarnation,
                                 std::optional<std::vector<bool>> on_this_machine)
    : config_(config),
      layout_(map, ChunkLayout::PartBytesFor(config, map)),
      rank_(rank),
      incarnation_(incarnation),
      chunk_version_(layout_.num_chunks()),
      topk_(config_.gradient_topk(), layout_),
      lanes_(config_, layout_),
      optimizer_state_(config_, layout_, rank_, incarnation_, &generation_,
                       [this](size_t shard) { return TypedStub(shard); }),
      local_shards_(on_this_machine.has_value() ? *std::move(on_this_machine)
                                                : ChunkLayout::OnThisMachine(layout_.map())),
      local_credit_(
          std::max(PushSchedule::kInFlightBytes, LeastCreditOf(layout_, local_shards_, true))),
      least_credit_(LeastCreditOf(layout_, local_shards_, false)),
      credit_(std::max(PushSchedule::kInFlightBytes, least_credit_)) {
  absl::MutexLock lock(&mu_);
  endpoints_.resize(layout_.num_shards());
  stubs_.resize(layout_.num_shards());
  for (const v1::ShardEndpoint& e : layout_.map().shards()) ConnectShard(e);
  epoch_ = layout_.map().epoch();
  for (size_t part : layout_.BackwardOrder())
    backward_order_.push_back(PushSchedule::Placed{part, layout_.parts()[part].shard});
}

ParameterClient::~ParameterClient() {
  // The calls of tickets nobody waited for still point at this client.
  absl::MutexLock lock(&ops_mu_);
  for (auto& [ticket, op] : ops_) AwaitCalls(op.get());
}

void ParameterClient::ConnectShard(const v1::ShardEndpoint& e) {
  // A fresh channel also for the same address: the old one may sit in
  // gRPC's reconnect backoff after the shard's process died.
  endpoints_[e.shard()] = e;
  stubs_[e.shard()] = std::make_shared<grpc::GenericStub>(MakeChannel(e.address()));
}

absl::Status ParameterClient::CheckCompatible(const v1::ShardMap& map) const {
  absl::StatusOr<MapFit> fit = FitShardMap(layout_.map(), map);
  if (!fit.ok()) return fit.status();
  if (*fit == MapFit::kReplaced)
    return absl::InvalidArgumentError(absl::StrCat(
        "shard map epoch ", map.epoch(), " places the chunks on ", map.shards_size(),
        " shards otherwise than this client's map of ", layout_.num_shards(),
        " (a re-sharding: it needs a new client)"));
  return absl::OkStatus();
}

absl::Status ParameterClient::UpdateShardMap(const v1::ShardMap& map) {
  if (absl::Status s = CheckCompatible(map); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  for (const v1::ShardEndpoint& e : map.shards()) {
    const v1::ShardEndpoint& known = endpoints_[e.shard()];
    if (known.address() != e.address() || known.incarnation() != e.incarnation())
      ConnectShard(e);
  }
  epoch_ = map.epoch();
  return absl::OkStatus();
}

uint64_t ParameterClient::map_epoch() const {
  absl::MutexLock lock(&mu_);
  return epoch_;
}

std::shared_ptr<grpc::GenericStub> ParameterClient::StubOf(const Part& part) const {
  absl::MutexLock lock(&mu_);
  return stubs_[part.shard];
}

uint64_t ParameterClient::min_pulled_version() const {
  if (chunk_version_.empty()) return 0;
  uint64_t lowest = std::numeric_limits<uint64_t>::max();
  for (const std::atomic<uint64_t>& v : chunk_version_) lowest = std::min(lowest, v.load());
  return lowest;
}

uint64_t ParameterClient::max_pulled_version() const {
  uint64_t highest = 0;
  for (const std::atomic<uint64_t>& v : chunk_version_) highest = std::max(highest, v.load());
  return highest;
}

ParameterClient::Ticket ParameterClient::Register(std::unique_ptr<Operation> op) {
  Operation* raw = op.get();
  // A sync push whose parts start as autograd makes them ready sends each
  // shard its parts in backward's order, the same on every worker.
  const bool strict = raw->push && raw->staged && config_.mode() == v1::MODE_SYNC;
  raw->schedule = std::make_unique<PushSchedule>(
      PushSchedule::Credits{credit_.load(), local_credit_, local_shards_},
      strict ? backward_order_ : std::vector<PushSchedule::Placed>{});
  Ticket ticket;
  {
    absl::MutexLock lock(&ops_mu_);
    ticket = next_ticket_++;
    ops_.emplace(ticket, std::move(op));
  }
  if (raw->staged) return ticket;  // its parts start as they are ready
  {
    std::lock_guard<std::mutex> lock(raw->mu);
    raw->outstanding = static_cast<int>(std::count_if(
        raw->calls.begin(), raw->calls.end(), [](const Call& c) { return !c.read_before; }));
  }
  for (size_t i = 0; i < raw->calls.size(); ++i)
    if (!raw->calls[i].read_before) Launch(raw, i);
  return ticket;
}

void ParameterClient::Launch(Operation* op, size_t index) {
  const Call& call = op->calls[index];
  // A pull's request is small, its replies wait; a lane's values are not in
  // the request.
  if (!op->push || call.lane != nullptr) {
    if (op->push) {  // the shard's next part need not wait for this one
      op->schedule->Bypass(index);
      Pump(op);
    }
    StartCall(op, index);
    return;
  }
  op->schedule->Enqueue(index, call.part->shard, call.request.Length());
  Pump(op);
}

void ParameterClient::Pump(Operation* op) {
  for (size_t next : op->schedule->Start()) StartCall(op, next, /*scheduled=*/true);
}

void ParameterClient::ScheduledCallWritten(Operation* op, size_t index) {
  op->schedule->Written(index);
  Pump(op);
}

std::unique_ptr<ParameterClient::Operation> ParameterClient::Take(Ticket ticket) {
  absl::MutexLock lock(&ops_mu_);
  auto it = ops_.find(ticket);
  if (it == ops_.end()) return nullptr;
  std::unique_ptr<Operation> op = std::move(it->second);
  ops_.erase(it);
  return op;
}

void ParameterClient::StartCall(Operation* op, size_t index, bool scheduled) {
  Call& call = op->calls[index];
  if (op->push && call.lane != nullptr &&
      call.lane->CanRing(call.part->shard, call.request.Length())) {
    // The shard serves this lane's doorbell: the same request, rung there.
    call.rung = true;
    call.rung_at = absl::Now();
    call.seq = call.lane->Ring(call.part->shard, index, call.request);
    return;
  }
  call.context = std::make_unique<grpc::ClientContext>();
  call.context->set_deadline(absl::ToChronoTime(
      op->push ? absl::Now() + kPushCallTimeout : op->deadline));
  // Each attempt asks for the stub again: a map update since the last
  // attempt sends this one to the shard's new endpoint.
  call.stub = StubOf(*call.part);
  call.reply.Clear();
  if (scheduled) {
    // The next part goes once this one's request is written; the credit
    // comes back with its reply. Both before OnCallDone, which may let the
    // waiter free `op`.
    StartOneMessageCall(
        call.stub.get(), call.context.get(), kPushMethod, &call.request, &call.reply,
        [this, op, index] { ScheduledCallWritten(op, index); },
        [this, op, index](grpc::Status status) {
          op->schedule->Replied(index, status.ok());
          ScheduledCallWritten(op, index);
          OnCallDone(op, index, std::move(status));
        });
    return;
  }
  StartUnaryCall(
      [&](grpc::ClientUnaryReactor* reactor) {
        call.stub->PrepareUnaryCall(call.context.get(), op->push ? kPushMethod : kPullMethod,
                                    grpc::StubOptions(), &call.request, &call.reply, reactor);
      },
      [this, op, index](grpc::Status status) { OnCallDone(op, index, std::move(status)); });
}

void ParameterClient::OnCallDone(Operation* op, size_t index, grpc::Status status) {
  Call& call = op->calls[index];
  const size_t shard = call.part->shard;
  absl::Status result = ToAbsl(status);
  v1::PushResponse header;
  ReplyRead read;
  if (result.ok()) {
    result = ReadPartReply(layout_, index, call.lane.get(), call.reply,
                           op->push ? &header : nullptr, op->host_params, &chunk_version_, &read);
    bytes_pulled_ += read.bytes;
    lane_bytes_ += read.lane_bytes;
  }
  if (!result.ok())
    result = absl::Status(result.code(),
                          absl::StrCat(op->push ? "push to shard " : "pull from shard ",
                                       shard, ": ", result.message()));
  if (op->push) push_calls_.fetch_add(1);
  if (result.ok() && op->push) {
    bytes_pushed_ += call.request.Length() + call.lane_bytes;
    lane_bytes_ += call.lane_bytes;
  }
  if (call.lane != nullptr) lanes_.CallEnded(call.lane, index, shard, result, header.doorbell());
  std::lock_guard<std::mutex> lock(op->mu);
  call.status = std::move(result);
  call.pulled = read.complete;
  op->outcome.late += header.late();
  op->outcome.too_stale += header.too_stale();
  if (--op->outstanding == 0) op->done.notify_all();
}

void ParameterClient::AwaitCalls(Operation* op) {
  for (size_t i = 0; i < op->calls.size(); ++i)
    if (op->calls[i].rung) FinishRung(op, i);
  op->AwaitCalls();
}

void ParameterClient::FinishRung(Operation* op, size_t index) {
  Call& call = op->calls[index];
  call.rung = false;
  const absl::Status status = call.lane->AwaitAnswer(call.part->shard, index, call.seq,
                                                     call.rung_at, kPushCallTimeout, &call.reply);
  doorbell_calls_.fetch_add(1);
  OnCallDone(op, index, ToGrpc(status));
}

ParameterClient::Ticket ParameterClient::PullAsync(uint64_t clock, absl::Duration timeout,
                                                   float* host_params) {
  auto op = std::make_unique<Operation>();
  op->host_params = host_params;
  op->read_clock = clock;
  op->read_generation = generation_.load();
  op->deadline = absl::Now() + timeout + absl::Seconds(5);
  const std::vector<Part>& parts = layout_.parts();
  op->calls.resize(parts.size());
  const std::vector<bool> read = PartsRead(clock, op->read_generation, host_params);
  for (size_t i = 0; i < parts.size(); ++i) {
    op->calls[i].part = &parts[i];
    if (i < read.size() && read[i]) {
      op->calls[i].read_before = op->calls[i].pulled = true;
      continue;
    }
    v1::PullRequest req;
    req.set_job_id(config_.job_id());
    req.set_worker_rank(rank_);
    req.set_clock(clock);
    req.set_timeout_ms(static_cast<uint32_t>(absl::ToInt64Milliseconds(timeout)));
    req.set_dtype(config_.wire_dtype());
    req.set_generation(op->read_generation);
    for (uint32_t id : parts[i].chunk_ids) req.add_chunk_ids(id);
    bool own_buffer;
    grpc::SerializationTraits<v1::PullRequest>::Serialize(req, &op->calls[i].request, &own_buffer);
  }
  return Register(std::move(op));
}

absl::Status ParameterClient::Pull(uint64_t clock, absl::Duration timeout,
                                   float* host_params) {
  return Wait(PullAsync(clock, timeout, host_params)).status();
}

v1::PushRequest ParameterClient::PushHeader(uint64_t step, uint32_t num_samples) const {
  v1::PushRequest header;
  header.set_job_id(config_.job_id());
  header.set_worker_rank(rank_);
  header.set_incarnation(incarnation_);
  header.set_step(step);
  header.set_num_samples(num_samples);
  header.set_generation(generation_.load());
  return header;
}

absl::Status ParameterClient::GiveInitialValues(const float* host_values,
                                                const RetryPolicy& retry) {
  auto op = std::make_unique<Operation>();
  op->push = true;
  op->header = PushHeader(0, 1);  // a push names at least one sample
  op->header.set_initial_values(true);
  op->host_grads = host_values;
  op->dtype = DType::kF32;  // the values exactly as the model holds them
  op->calls.resize(layout_.parts().size());
  for (size_t i = 0; i < op->calls.size(); ++i) EncodePushCall(op.get(), i);
  return Wait(Register(std::move(op)), retry).status();
}

std::unique_ptr<v1::ParameterServer::Stub> ParameterClient::TypedStub(size_t shard) const {
  absl::MutexLock lock(&mu_);
  return v1::ParameterServer::NewStub(MakeChannel(endpoints_[shard].address()));
}

absl::Status ParameterClient::SetOptimizers(std::vector<v1::OptimizerConfig> optimizers,
                                           const std::vector<uint32_t>& by_tensor) {
  std::shared_ptr<ProgramOptimizers> set;
  if (!optimizers.empty() || !by_tensor.empty()) {
    if (by_tensor.size() != layout_.num_tensors())
      return absl::InvalidArgumentError(absl::StrCat(
          "an optimizer for each of ", by_tensor.size(), " tensors; the model has ",
          layout_.num_tensors()));
    set = std::make_shared<ProgramOptimizers>();
    set->by_chunk.assign(layout_.num_chunks(), 0);
    for (size_t t = 0; t < by_tensor.size(); ++t) {
      if (by_tensor[t] > optimizers.size())
        return absl::InvalidArgumentError(absl::StrCat(
            "tensor ", t, " names optimizer ", by_tensor[t], " of ", optimizers.size()));
      for (uint32_t id : layout_.tensor_chunks(t)) set->by_chunk[id] = by_tensor[t];
    }
    set->optimizers = std::move(optimizers);
  }
  absl::MutexLock lock(&optimizers_mu_);
  optimizers_ = std::move(set);
  return absl::OkStatus();
}

std::unique_ptr<ParameterClient::Operation> ParameterClient::NewPush(
    uint64_t step, const float* host_grads, uint32_t num_samples, float* pull_into,
    absl::Duration pull_timeout) const {
  auto op = std::make_unique<Operation>();
  op->push = true;
  op->header = PushHeader(step, num_samples);
  {
    absl::MutexLock lock(&optimizers_mu_);
    op->optimizers = optimizers_;
  }
  if (op->optimizers != nullptr)
    for (const v1::OptimizerConfig& o : op->optimizers->optimizers) *op->header.add_optimizers() = o;
  if (pull_into != nullptr) {
    op->read_clock = step + 1;
    op->read_generation = op->header.generation();
    op->header.set_pull(true);
    op->header.set_pull_timeout_ms(static_cast<uint32_t>(
        std::max<int64_t>(1, absl::ToInt64Milliseconds(pull_timeout))));
    op->header.set_pull_dtype(config_.wire_dtype());
  }
  op->host_grads = host_grads;
  op->dtype = *DTypeFromWire(JobWireDType(config_), true, "push");
  op->host_params = pull_into;
  op->calls.resize(layout_.parts().size());
  return op;
}

ParameterClient::Ticket ParameterClient::PushAsync(uint64_t step, const float* host_grads,
                                                   uint32_t num_samples, float* pull_into,
                                                   absl::Duration pull_timeout) {
  std::unique_ptr<Operation> op =
      NewPush(step, host_grads, num_samples, pull_into, pull_timeout);
  const v1::PushRequest& header = op->header;
  const v1::DType wire = JobWireDType(config_);
  const DType d = op->dtype;
  if (CanStage()) {
    for (size_t i = 0; i < op->calls.size(); ++i) EncodePushCall(op.get(), i);
    return Register(std::move(op));
  }
  // Top-k: each part's selection is made once; a retry sends the same bytes.
  const std::vector<Part>& parts = layout_.parts();
  std::vector<std::vector<WireChunk>> chunks;
  for (const Part& part : parts) chunks.push_back(ChunkHeads(*op, part));
  topk_.Select(step, header.generation(), host_grads, d, &chunks);
  for (size_t i = 0; i < parts.size(); ++i) {
    op->calls[i].request = EncodePushRequest(header, wire, std::move(chunks[i]));
    op->calls[i].part = &parts[i];
  }
  return Register(std::move(op));
}

bool ParameterClient::CanStage() const {
  const float topk = config_.gradient_topk();
  return !(topk > 0 && topk < 1);
}

ParameterClient::Ticket ParameterClient::StagePush(uint64_t step, const float* host_grads,
                                                   uint32_t num_samples, float* pull_into,
                                                   absl::Duration pull_timeout) {
  if (!CanStage()) return PushAsync(step, host_grads, num_samples, pull_into, pull_timeout);
  std::unique_ptr<Operation> op =
      NewPush(step, host_grads, num_samples, pull_into, pull_timeout);
  op->staged = true;
  op->started.assign(layout_.parts().size(), false);
  op->tensor_ready.assign(layout_.num_tensors(), false);
  for (const Part& part : layout_.parts())
    op->waiting_chunks.push_back(static_cast<uint32_t>(part.chunk_ids.size()));
  return Register(std::move(op));
}

absl::Status ParameterClient::TensorReady(Ticket ticket, uint32_t tensor_index) {
  Operation* op = nullptr;
  {
    absl::MutexLock lock(&ops_mu_);
    auto it = ops_.find(ticket);
    if (it != ops_.end()) op = it->second.get();
  }
  if (op == nullptr)
    return absl::InvalidArgumentError(absl::StrCat("ticket ", ticket, " is not in flight"));
  if (!op->staged) return absl::OkStatus();  // top-k: all of it goes at Wait
  if (tensor_index >= op->tensor_ready.size())
    return absl::InvalidArgumentError(absl::StrCat("the model has no tensor ", tensor_index));
  if (op->tensor_ready[tensor_index]) return absl::OkStatus();
  op->tensor_ready[tensor_index] = true;
  for (uint32_t id : layout_.tensor_chunks(tensor_index)) {
    const size_t part = layout_.part_of(id);
    if (--op->waiting_chunks[part] == 0) StartStaged(op, part);
  }
  return absl::OkStatus();
}

void ParameterClient::StartStaged(Operation* op, size_t index) {
  op->started[index] = true;
  EncodePushCall(op, index);
  {
    std::lock_guard<std::mutex> lock(op->mu);
    ++op->outstanding;
  }
  Launch(op, index);
}

void ParameterClient::Discard(Ticket ticket) {
  std::unique_ptr<Operation> op = Take(ticket);
  if (op != nullptr) AwaitCalls(op.get());
}

std::vector<WireChunk> ParameterClient::ChunkHeads(const Operation& op, const Part& part) const {
  std::vector<WireChunk> chunks(part.chunk_ids.size());
  for (size_t k = 0; k < chunks.size(); ++k) {
    const uint32_t id = part.chunk_ids[k];
    chunks[k].chunk_id = id;
    chunks[k].version = chunk_version_[id].load();
    if (op.optimizers != nullptr) chunks[k].optimizer = op.optimizers->by_chunk[id];
  }
  return chunks;
}

void ParameterClient::EncodePushCall(Operation* op, size_t index) {
  Call& call = op->calls[index];
  const Part& part = layout_.parts()[index];
  call.part = &part;
  call.lane = nullptr;
  call.lane_bytes = 0;
  // Initial values travel in the message.
  if (!op->header.initial_values()) call.lane = lanes_.Take(index, part.shard);
  v1::PushRequest header = op->header;
  if (call.lane != nullptr)
    *header.mutable_lane() = call.lane->RefFor(part.shard, index, header.pull());
  std::vector<WireChunk> chunks = ChunkHeads(*op, part);
  call.lane_bytes =
      PutPushValues(layout_, op->host_grads, op->dtype, call.lane.get(), index, &chunks);
  call.request = EncodePushRequest(header, DTypeToWire(op->dtype), std::move(chunks));
}

namespace {

// Whether a failed push is worth sending again. UNAVAILABLE: the shard is
// down or not restored to this generation yet. RESOURCE_EXHAUSTED, for a
// push gRPC can carry at all: the shard's gRPC is short of memory for calls
// right now (its quota, see daemon/daemon.h).
bool Transient(const absl::Status& s, const grpc::ByteBuffer& request) {
  return absl::IsUnavailable(s) ||
         (absl::IsResourceExhausted(s) && request.Length() <= kMaxMessageBytes);
}

}  // namespace

absl::StatusOr<ParameterClient::PushOutcome> ParameterClient::Wait(
    Ticket ticket, const RetryPolicy& retry) {
  std::unique_ptr<Operation> op = Take(ticket);
  if (op == nullptr)
    return absl::InvalidArgumentError(absl::StrCat("ticket ", ticket, " is not in flight"));
  absl::StatusOr<PushOutcome> outcome = AwaitOutcome(op.get(), retry);
  NoteRead(*op);
  return outcome;
}

absl::StatusOr<ParameterClient::PushOutcome> ParameterClient::AwaitOutcome(
    Operation* op, const RetryPolicy& retry) {
  if (op->staged)
    for (size_t i = 0; i < op->calls.size(); ++i)
      if (!op->started[i]) StartStaged(op, i);
  const absl::Time give_up = absl::Now() + retry.retry_for;
  absl::Duration backoff = retry.initial_backoff;
  bool retried = false;
  RetryNotice notice;
  while (true) {
    std::vector<size_t> again, refused;
    absl::Status first;
    {
      AwaitCalls(op);
      std::lock_guard<std::mutex> lock(op->mu);
      for (size_t i = 0; i < op->calls.size(); ++i) {
        const absl::Status& s = op->calls[i].status;
        if (s.ok()) continue;
        // A shard that cannot use the lane changed nothing: bytes, at once.
        if (op->push && op->calls[i].lane != nullptr && absl::IsUnimplemented(s))
          refused.push_back(i);
        else if (op->push && Transient(s, op->calls[i].request)) again.push_back(i);
        else if (first.ok()) first = s;
      }
      if (first.ok() && again.empty() && refused.empty()) {
        // A push whose every part went once through the schedule measured
        // the link; one of a few parts, of lanes, or retried did not.
        if (op->push && !retried)
          if (std::optional<size_t> credit = op->schedule->Measured())
            credit_.store(std::max(*credit, least_credit_));
        PushOutcome outcome = op->outcome;
        outcome.pulled = op->push && op->host_params != nullptr;
        for (const Call& c : op->calls) outcome.pulled = outcome.pulled && c.pulled;
        return outcome;
      }
    }
    if (!first.ok()) return first;
    if (!again.empty()) {
      absl::Status unavailable = op->calls[again.front()].status;
      if (absl::Now() + backoff > give_up) return unavailable;
      notice.Refused(absl::StrCat("a push of step ", op->header.step(), " to shard ",
                                  op->calls[again.front()].part->shard),
                     unavailable);
      if (!SleepUnlessStopped(backoff, retry.stop))
        return absl::CancelledError(
            absl::StrCat("gave up retrying (", unavailable.message(), ")"));
      backoff = std::min(backoff * 2, retry.max_backoff);
    }
    again.insert(again.end(), refused.begin(), refused.end());
    retried = true;
    {
      std::lock_guard<std::mutex> lock(op->mu);
      op->outstanding = static_cast<int>(again.size());
    }
    for (size_t i : again) {
      // A lane call is encoded again: on a fresh lane, or in bytes.
      if (op->calls[i].lane != nullptr) EncodePushCall(op, i);
      StartCall(op, i);
    }
  }
}

void ParameterClient::NoteRead(const Operation& op) {
  if (op.host_params == nullptr) return;
  std::vector<bool> read(op.calls.size());
  for (size_t i = 0; i < read.size(); ++i) read[i] = op.calls[i].status.ok() && op.calls[i].pulled;
  const bool all = std::all_of(read.begin(), read.end(), [](bool r) { return r; });
  absl::MutexLock lock(&read_mu_);
  const bool same = !read_.parts.empty() && read_.clock == op.read_clock &&
                    read_.generation == op.read_generation && read_.into == op.host_params;
  if (all) {
    if (same) read_.parts.clear();  // the clock's weights are whole there
    return;
  }
  if (!same)
    read_ = ReadSoFar{op.read_clock, op.read_generation, op.host_params,
                      std::vector<bool>(read.size(), false)};
  for (size_t i = 0; i < read.size(); ++i) read_.parts[i] = read_.parts[i] || read[i];
}

std::vector<bool> ParameterClient::PartsRead(uint64_t clock, uint64_t generation,
                                             const float* into) const {
  absl::MutexLock lock(&read_mu_);
  if (read_.clock != clock || read_.generation != generation || read_.into != into) return {};
  return read_.parts;
}

absl::StatusOr<ParameterClient::PushOutcome> ParameterClient::Wait(Ticket ticket) {
  return Wait(ticket, RetryPolicy());
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
  return Wait(PushAsync(step, host_grads, num_samples), retry);
}

absl::StatusOr<ParameterClient::PushOutcome> ParameterClient::PushAndPull(
    uint64_t step, const float* host_grads, uint32_t num_samples, float* pull_into,
    absl::Duration pull_timeout, const RetryPolicy& retry) {
  return Wait(PushAsync(step, host_grads, num_samples, pull_into, pull_timeout), retry);
}

ParameterShards::Traffic ParameterClient::traffic() const {
  Traffic t;
  t.bytes_pushed = bytes_pushed();
  t.bytes_pulled = bytes_pulled();
  t.lane_bytes = lane_bytes();
  t.push_calls = push_calls();
  t.doorbell_calls = doorbell_calls();
  return t;
}

}  // namespace grps
