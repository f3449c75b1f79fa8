#include "worker/parameter_client.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"
#include "daemon/daemon.h"
#include "job/job_config.h"
#include "job/shard_map.h"
#include "tensor/dtype.h"
#include "wire/chunk_codec.h"
#include "wire/lane_doorbell.h"
#include "wire/shared_lane.h"

namespace grps {
namespace {

constexpr char kPushMethod[] = "/grps.v1.ParameterServer/Push";
constexpr char kPullMethod[] = "/grps.v1.ParameterServer/Pull";

// f32 when the job leaves the wire dtype unspecified.
v1::DType JobWireDType(const v1::JobConfig& config) {
  return config.wire_dtype() == v1::DTYPE_UNSPECIFIED ? v1::DTYPE_F32 : config.wire_dtype();
}

// The same piece of the same tensor, wherever it is placed.
bool SameChunk(const v1::ChunkSpec& a, const v1::ChunkSpec& b) {
  return a.chunk_id() == b.chunk_id() && a.tensor_index() == b.tensor_index() &&
         a.offset() == b.offset() && a.num_elements() == b.num_elements();
}

bool SameTensor(const v1::TensorSpec& a, const v1::TensorSpec& b) {
  return a.name() == b.name() &&
         std::equal(a.shape().begin(), a.shape().end(), b.shape().begin(),
                    b.shape().end());
}

}  // namespace

absl::StatusOr<MapFit> FitShardMap(const v1::ShardMap& layout, const v1::ShardMap& map) {
  if (absl::Status s = ValidateShardMap(map); !s.ok())
    return absl::InvalidArgumentError(
        absl::StrCat("shard map epoch ", map.epoch(), ": ", s.message()));
  if (map.tensors_size() != layout.tensors_size() || map.chunks_size() != layout.chunks_size())
    return absl::InvalidArgumentError(absl::StrCat(
        "shard map epoch ", map.epoch(), " has ", map.tensors_size(), " tensors and ",
        map.chunks_size(), " chunks; the job's map has ", layout.tensors_size(), " and ",
        layout.chunks_size()));
  for (int i = 0; i < map.tensors_size(); ++i)
    if (!SameTensor(map.tensors(i), layout.tensors(i)))
      return absl::InvalidArgumentError(absl::StrCat(
          "shard map epoch ", map.epoch(), ": tensor ", i, " differs"));
  for (int i = 0; i < map.chunks_size(); ++i)
    if (!SameChunk(map.chunks(i), layout.chunks(i)))
      return absl::InvalidArgumentError(absl::StrCat(
          "shard map epoch ", map.epoch(), ": chunk ", i, " is cut differently"));
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
  if (map.shards_size() != layout.shards_size()) return MapFit::kReplaced;
  for (int i = 0; i < map.chunks_size(); ++i)
    if (map.chunks(i).shard() != layout.chunks(i).shard()) return MapFit::kReplaced;
  return MapFit::kSameLayout;
}

bool SleepUnlessStopped(absl::Duration d, const std::function<bool()>& stop) {
  const absl::Time until = absl::Now() + d;
  while (true) {
    if (ShutdownRequested() || (stop && stop())) return false;
    const absl::Duration left = until - absl::Now();
    if (left <= absl::ZeroDuration()) return true;
    absl::SleepFor(std::min(left, absl::Milliseconds(10)));
  }
}

// A LaneSegment with a place of `bytes[i]` bytes at `place[i]` for each
// part i, and whether a call holds it (`busy[i]`). A push's gradients and
// its fused pull's weights share the place: the shard copies the gradients
// out before it accepts the push, and writes the weights after. After the
// places, a doorbell area for each shard (wire/lane_doorbell.h) with a slot
// for each of its parts (`slot[i]`), and whether the shard serves it
// (`open[shard]`, set when a reply says so).
struct ParameterClient::Lane {
  std::shared_ptr<LaneSegment> segment;
  std::vector<uint64_t> place, bytes;
  std::unique_ptr<std::atomic<bool>[]> busy;
  std::vector<uint64_t> doorbell_offset;  // by shard
  uint32_t slot_bytes = 0;
  std::vector<LaneDoorbell> doorbell;     // by shard
  std::vector<uint32_t> slot;             // by part
  std::unique_ptr<std::atomic<bool>[]> open;  // by shard
};

namespace {

// Whether a push that failed with `s` may have been accepted by the shard
// without the worker hearing so: then the shard may still write the fused
// pull's weights into the call's place. A status the shard's handler or
// its gRPC quota sent means it refused the push before anything waited.
bool MayWriteLate(const absl::Status& s) {
  return absl::IsDeadlineExceeded(s) || absl::IsCancelled(s) || absl::IsUnavailable(s) ||
         absl::IsUnknown(s) || absl::IsInternal(s) || absl::IsDataLoss(s);
}

}  // namespace

// One call of an operation: a request to one shard, its reply, its status.
struct ParameterClient::Call {
  const Part* part = nullptr;
  bool pulled = false;  // a fused push's reply carried every chunk
  // The lane whose place for the part this push holds, or null: bytes.
  std::shared_ptr<Lane> lane;
  // Rung at the lane's doorbell (not called through gRPC), with this
  // sequence, at this time; completed by the thread that waits for it.
  bool rung = false;
  uint32_t seq = 0;
  absl::Time rung_at;
  uint64_t lane_bytes = 0;  // gradient bytes it put in the lane
  absl::Time started_at;  // a scheduled call's start (guarded by the operation's mu)
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
  absl::Time deadline;           // pull: of every attempt
  std::vector<Call> calls;       // a call's status is guarded by mu
  // A staged push (StagePush): which parts started, and how many of each
  // part's chunks still wait for their tensor; which tensors are ready.
  bool staged = false;
  std::vector<bool> started;
  std::vector<uint32_t> waiting_chunks;
  std::vector<bool> tensor_ready;
  std::mutex mu;
  std::condition_variable done;
  int outstanding = 0;   // guarded by mu
  // The push schedule (guarded by mu): calls ready to start, each shard's
  // call whose request is being written, the started calls not yet done and
  // their request bytes.
  std::set<size_t> queued;
  std::map<size_t, size_t> writing;  // shard -> call
  std::set<size_t> in_flight;
  size_t in_flight_bytes = 0;
  size_t credit = 0;  // set when the push starts
  // What the schedule measures for the next push's credit (guarded by mu):
  // its first call's start, its last reply, its quickest call, and the
  // request bytes of its replies.
  absl::Time first_start = absl::InfiniteFuture();
  absl::Time last_reply = absl::InfinitePast();
  absl::Duration shortest = absl::InfiniteDuration();
  size_t replied_bytes = 0;
  PushOutcome outcome;   // guarded by mu

  void AwaitCalls() {
    std::unique_lock<std::mutex> lock(mu);
    done.wait(lock, [this] { return outstanding == 0; });
  }
};

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
  chunk_version_ = std::vector<std::atomic<uint64_t>>(layout_.chunks_size());
  // Each shard's chunks, in runs of at most kPartBytes of f32 (the widest
  // wire dtype; a larger chunk alone), dealt over the shard's channels in
  // turn; then every part in the model's order (its first chunk's), so the
  // shards take turns and every worker sends the same part first.
  std::vector<std::vector<uint32_t>> shard_chunks(layout_.shards_size());
  for (const v1::ChunkSpec& c : layout_.chunks())
    shard_chunks[c.shard()].push_back(c.chunk_id());
  for (size_t shard = 0; shard < shard_chunks.size(); ++shard) {
    int next_channel = 0;
    size_t bytes = 0;
    for (uint32_t id : shard_chunks[shard]) {
      const size_t chunk_bytes = layout_.chunks(id).num_elements() * sizeof(float);
      if (parts_.empty() || parts_.back().shard != shard || bytes + chunk_bytes > kPartBytes) {
        parts_.push_back(Part{shard, next_channel, {}});
        next_channel = (next_channel + 1) % kChannelsPerShard;
        bytes = 0;
      }
      parts_.back().chunk_ids.push_back(id);
      bytes += chunk_bytes;
    }
  }
  std::stable_sort(parts_.begin(), parts_.end(), [](const Part& a, const Part& b) {
    return a.chunk_ids.front() < b.chunk_ids.front();
  });
  part_of_chunk_.assign(layout_.chunks_size(), 0);
  for (size_t i = 0; i < parts_.size(); ++i)
    for (uint32_t id : parts_[i].chunk_ids) part_of_chunk_[id] = static_cast<uint32_t>(i);
  tensor_chunks_.resize(layout_.tensors_size());
  for (const v1::ChunkSpec& c : layout_.chunks())
    tensor_chunks_[c.tensor_index()].push_back(c.chunk_id());
  {
    absl::MutexLock lock(&lane_mu_);
    lane_ = MakeLane();
    lane_refused_.assign(layout_.shards_size(), false);
  }
  absl::MutexLock lock(&mu_);
  endpoints_.resize(layout_.shards_size());
  stubs_.resize(layout_.shards_size());
  for (const v1::ShardEndpoint& e : layout_.shards()) ConnectShard(e);
  epoch_ = layout_.epoch();
}

std::shared_ptr<ParameterClient::Lane> ParameterClient::MakeLane() const {
  const float topk = config_.gradient_topk();
  if (config_.local_transport() != v1::LOCAL_TRANSPORT_SHARED_MEMORY || (topk > 0 && topk < 1))
    return nullptr;  // sparse (top-k) gradients travel in bytes
  auto lane = std::make_shared<Lane>();
  uint64_t at = kLaneHeaderBytes;
  size_t most_chunks = 0;
  const size_t shards = layout_.shards_size();
  // Each shard's slots: one per part to it (at least one, as an area needs).
  std::vector<uint32_t> slots(shards, 0);
  for (const Part& part : parts_) {
    uint64_t bytes = 0;
    for (uint32_t id : part.chunk_ids)
      bytes += layout_.chunks(id).num_elements() * sizeof(float);  // the widest dtype
    bytes = (bytes + 63) / 64 * 64;
    lane->bytes.push_back(bytes);
    lane->place.push_back(at);
    at += bytes;
    most_chunks = std::max(most_chunks, part.chunk_ids.size());
    lane->slot.push_back(slots[part.shard]++);
  }
  // A slot holds a PushRequest without values, or its PushResponse: the
  // job id, the lane, and a few varints per chunk.
  const uint64_t capacity = 1024 + config_.job_id().size() + 64 * uint64_t{most_chunks};
  lane->slot_bytes = LaneDoorbell::SlotBytesFor(static_cast<uint32_t>(
      std::min<uint64_t>(capacity, kMaxDoorbellSlotBytes)));
  for (size_t shard = 0; shard < shards; ++shard) {
    slots[shard] = std::max<uint32_t>(1, slots[shard]);
    lane->doorbell_offset.push_back(at);
    at += LaneDoorbell::AreaBytes(slots[shard], lane->slot_bytes);
  }
  if (at > kMaxLaneBytes) return nullptr;
  absl::StatusOr<std::shared_ptr<LaneSegment>> segment =
      LaneSegment::Create(at - kLaneHeaderBytes);
  if (!segment.ok()) return nullptr;
  lane->segment = std::move(*segment);
  lane->busy = std::make_unique<std::atomic<bool>[]>(parts_.size());
  for (size_t i = 0; i < parts_.size(); ++i) lane->busy[i].store(false);
  lane->open = std::make_unique<std::atomic<bool>[]>(shards);
  for (size_t shard = 0; shard < shards; ++shard) {
    lane->open[shard].store(false);
    lane->doorbell.emplace_back(lane->segment->base() + lane->doorbell_offset[shard],
                                slots[shard], lane->slot_bytes);
  }
  return lane;
}

void ParameterClient::RetireLane(const std::shared_ptr<Lane>& lane) {
  absl::MutexLock lock(&lane_mu_);
  if (lane_ == lane) lane_ = MakeLane();
}

bool ParameterClient::LaneUsable(size_t shard) const {
  absl::MutexLock lock(&lane_mu_);
  return lane_ != nullptr && shard < lane_refused_.size() && !lane_refused_[shard];
}

ParameterClient::~ParameterClient() {
  // The calls of tickets nobody waited for still point at this client.
  absl::MutexLock lock(&ops_mu_);
  for (auto& [ticket, op] : ops_) AwaitCalls(op.get());
}

void ParameterClient::ConnectShard(const v1::ShardEndpoint& e) {
  // Fresh channels also for the same address: the old ones may sit in
  // gRPC's reconnect backoff after the shard's process died.
  endpoints_[e.shard()] = e;
  stubs_[e.shard()].clear();
  for (int c = 0; c < kChannelsPerShard; ++c)
    stubs_[e.shard()].push_back(std::make_shared<grpc::GenericStub>(MakeChannel(e.address())));
}

absl::Status ParameterClient::CheckCompatible(const v1::ShardMap& map) const {
  absl::StatusOr<MapFit> fit = FitShardMap(layout_, map);
  if (!fit.ok()) return fit.status();
  if (*fit == MapFit::kReplaced)
    return absl::InvalidArgumentError(absl::StrCat(
        "shard map epoch ", map.epoch(), " places the chunks on ", map.shards_size(),
        " shards otherwise than this client's map of ", layout_.shards_size(),
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
  return stubs_[part.shard][part.channel];
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
  raw->credit = credit_.load();
  Ticket ticket;
  {
    absl::MutexLock lock(&ops_mu_);
    ticket = next_ticket_++;
    ops_.emplace(ticket, std::move(op));
  }
  if (raw->staged) return ticket;  // its parts start as they are ready
  {
    std::lock_guard<std::mutex> lock(raw->mu);
    raw->outstanding = static_cast<int>(raw->calls.size());
  }
  for (size_t i = 0; i < raw->calls.size(); ++i) Launch(raw, i);
  return ticket;
}

void ParameterClient::Launch(Operation* op, size_t index) {
  const Call& call = op->calls[index];
  // A pull's request is small, its replies wait; a lane's values are not in
  // the request.
  if (!op->push || call.lane != nullptr) {
    StartCall(op, index);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(op->mu);
    op->queued.insert(index);
  }
  Pump(op);
}

size_t ParameterClient::CreditFor(size_t bytes, absl::Duration window,
                                  absl::Duration shortest) {
  if (window <= absl::ZeroDuration() || shortest == absl::InfiniteDuration())
    return kInFlightBytes;
  const double product = static_cast<double>(bytes) / absl::ToDoubleSeconds(window) *
                         absl::ToDoubleSeconds(shortest);
  return static_cast<size_t>(std::clamp(kCreditRoundTrips * product,
                                        static_cast<double>(kMinCredit),
                                        static_cast<double>(kInFlightBytes)));
}

void ParameterClient::Pump(Operation* op) {
  std::vector<size_t> start;
  {
    std::lock_guard<std::mutex> lock(op->mu);
    const absl::Time now = absl::Now();
    // The ready parts in the model's order, each once its shard's part
    // before has been written. Past the credit only a part ahead of every
    // one in flight: a sync part's reply waits for every worker's push of
    // it, and a worker whose hooks made its parts ready in another order
    // must still send the part the others wait for.
    for (auto it = op->queued.begin(); it != op->queued.end();) {
      const size_t next = *it;
      const size_t shard = op->calls[next].part->shard;
      if (op->writing.count(shard) > 0) {
        ++it;
        continue;
      }
      const size_t bytes = op->calls[next].request.Length();
      if (!op->in_flight.empty() && op->in_flight_bytes + bytes > op->credit &&
          next > *op->in_flight.begin())
        break;
      it = op->queued.erase(it);
      op->calls[next].started_at = now;
      op->first_start = std::min(op->first_start, now);
      op->writing[shard] = next;
      op->in_flight.insert(next);
      op->in_flight_bytes += bytes;
      start.push_back(next);
    }
  }
  for (size_t next : start) StartCall(op, next, /*scheduled=*/true);
}

void ParameterClient::ScheduledCallWritten(Operation* op, size_t index) {
  {
    std::lock_guard<std::mutex> lock(op->mu);
    auto it = op->writing.find(op->calls[index].part->shard);
    if (it != op->writing.end() && it->second == index) op->writing.erase(it);
  }
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
  if (op->push && call.lane != nullptr && call.lane->open[call.part->shard].load() &&
      call.request.Length() <= call.lane->doorbell[call.part->shard].capacity()) {
    // The shard serves this lane's doorbell: the same request, rung there.
    call.rung = true;
    call.rung_at = absl::Now();
    call.seq = call.lane->doorbell[call.part->shard].Ring(call.lane->slot[index], call.request);
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
    const size_t bytes = call.request.Length();
    StartOneMessageCall(
        call.stub.get(), call.context.get(), kPushMethod, &call.request, &call.reply,
        [this, op, index] { ScheduledCallWritten(op, index); },
        [this, op, index, bytes](grpc::Status status) {
          {
            std::lock_guard<std::mutex> lock(op->mu);
            op->in_flight.erase(index);
            op->in_flight_bytes -= bytes;
            if (status.ok()) {
              const absl::Time now = absl::Now();
              op->shortest = std::min(op->shortest, now - op->calls[index].started_at);
              op->last_reply = now;
              op->replied_bytes += bytes;
            }
          }
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
  bool complete = false;
  if (result.ok())
    result = ReadReply(*call.part, op->push ? &call : nullptr, call.reply, op->push,
                       op->host_params, &header, &complete);
  if (!result.ok())
    result = absl::Status(result.code(),
                          absl::StrCat(op->push ? "push to shard " : "pull from shard ",
                                       shard, ": ", result.message()));
  if (op->push) push_calls_.fetch_add(1);
  if (result.ok() && op->push) {
    bytes_pushed_ += call.request.Length() + call.lane_bytes;
    lane_bytes_ += call.lane_bytes;
  }
  if (call.lane != nullptr) {
    // The shard serves the lane's doorbell: its later pushes are rung.
    if (result.ok() && header.doorbell()) call.lane->open[shard].store(true);
    if (MayWriteLate(result)) {
      // Never use this place again: a fresh lane for this and later calls.
      RetireLane(call.lane);
    } else {
      if (absl::IsUnimplemented(result)) {
        // The shard cannot use the lane (and changed nothing): bytes from now on.
        absl::MutexLock lock(&lane_mu_);
        if (!lane_refused_[shard])
          spdlog::info("shard {} cannot use this worker's shared-memory lane; its values go "
                       "through gRPC ({})", shard, std::string(result.message()));
        lane_refused_[shard] = true;
      }
      call.lane->busy[index].store(false);
    }
  }
  std::lock_guard<std::mutex> lock(op->mu);
  call.status = std::move(result);
  call.pulled = complete;
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
  const size_t shard = call.part->shard;
  const uint32_t slot = call.lane->slot[index];
  const LaneDoorbell& bell = call.lane->doorbell[shard];
  // A call's deadline, as the gRPC call's; a shard that stops beating is
  // gone (or stopped serving the doorbell) long before it.
  const absl::Time deadline = call.rung_at + kPushCallTimeout;
  uint32_t beat = bell.beat();
  absl::Time beat_at = absl::Now();
  absl::Status status;
  while (true) {
    const absl::Time now = absl::Now();
    if (bell.AwaitAnswer(slot, call.seq, std::min(deadline - now, kDoorbellBeat))) {
      status = bell.TakeAnswer(slot, &call.reply);
      break;
    }
    const absl::Time later = absl::Now();
    if (later >= deadline) {
      status = absl::DeadlineExceededError(absl::StrCat(
          "no answer at the shard's doorbell in ", absl::FormatDuration(kPushCallTimeout)));
      break;
    }
    if (const uint32_t b = bell.beat(); b != beat) {
      beat = b;
      beat_at = later;
    } else if (later - beat_at >= kDoorbellSilence) {
      status = absl::UnavailableError(absl::StrCat(
          "the shard stopped serving this worker's doorbell (no beat for ",
          absl::FormatDuration(later - beat_at), ")"));
      break;
    }
  }
  doorbell_calls_.fetch_add(1);
  OnCallDone(op, index, ToGrpc(status));
}

absl::Status ParameterClient::ReadReply(const Part& part, const Call* call,
                                        const grpc::ByteBuffer& reply, bool push,
                                        float* host_params, v1::PushResponse* push_header,
                                        bool* complete) {
  const Lane* lane = call != nullptr ? call->lane.get() : nullptr;
  thread_local std::string scratch;  // for f16 / bf16 payloads, reused
  std::vector<bool> wanted(layout_.chunks_size(), false), seen(wanted.size(), false);
  for (uint32_t id : part.chunk_ids) wanted[id] = true;
  uint64_t bytes = 0, lane_read = 0;
  size_t count = 0;
  auto on_chunk = [&](ReceivedChunk& c) -> absl::Status {
    if (c.chunk_id >= wanted.size() || !wanted[c.chunk_id] || seen[c.chunk_id] ||
        host_params == nullptr)
      return absl::DataLossError(absl::StrCat("returned unexpected chunk ", c.chunk_id));
    seen[c.chunk_id] = true;
    ++count;
    absl::StatusOr<DType> d =
        DTypeFromWire(c.dtype, false, absl::StrCat("chunk ", c.chunk_id));
    if (!d.ok()) return absl::DataLossError(d.status().message());
    const uint64_t n = layout_.chunks(c.chunk_id).num_elements();
    float* dst = host_params + chunk_offset_[c.chunk_id];
    if (c.lane_offset != 0) {
      // Only inside this part's place in the lane the push named.
      const uint64_t size = n * DTypeSize(*d);
      const size_t i = static_cast<size_t>(&part - parts_.data());
      if (lane == nullptr || !c.data.AtEnd() ||
          !LaneSpanWithin(c.lane_offset, size, lane->place[i], lane->place[i] + lane->bytes[i]))
        return absl::DataLossError(absl::StrCat("chunk ", c.chunk_id, " names lane offset ",
                                                c.lane_offset, " outside its place"));
      ConvertElements(lane->segment->base() + c.lane_offset, *d, dst, DType::kF32, n);
      bytes += size;
      lane_read += size;
    } else {
      bytes += c.data.left();
      if (absl::Status r = ReadValues(c.data, *d, dst, n, &scratch); !r.ok())
        return absl::DataLossError(absl::StrCat("chunk ", c.chunk_id, ": ", r.message()));
    }
    chunk_version_[c.chunk_id].store(c.version);
    return absl::OkStatus();
  };
  absl::Status s = push ? DecodePushResponse(reply, push_header, on_chunk)
                        : DecodePullResponse(reply, on_chunk);
  if (!s.ok()) return s;
  bytes_pulled_ += bytes;
  lane_bytes_ += lane_read;
  *complete = count == part.chunk_ids.size();
  // A pull must bring every chunk; a fused push's reply may bring none.
  if (!push && !*complete) {
    for (uint32_t id : part.chunk_ids)
      if (!seen[id]) return absl::DataLossError(absl::StrCat("omitted chunk ", id));
  }
  if (push && count > 0 && !*complete)
    return absl::DataLossError("a push's reply carried only some of its chunks");
  return absl::OkStatus();
}

ParameterClient::Ticket ParameterClient::PullAsync(uint64_t clock, absl::Duration timeout,
                                                   float* host_params) {
  auto op = std::make_unique<Operation>();
  op->host_params = host_params;
  op->deadline = absl::Now() + timeout + absl::Seconds(5);
  op->calls.resize(parts_.size());
  for (size_t i = 0; i < parts_.size(); ++i) {
    v1::PullRequest req;
    req.set_job_id(config_.job_id());
    req.set_worker_rank(rank_);
    req.set_clock(clock);
    req.set_timeout_ms(static_cast<uint32_t>(absl::ToInt64Milliseconds(timeout)));
    req.set_dtype(config_.wire_dtype());
    req.set_generation(generation_.load());
    for (uint32_t id : parts_[i].chunk_ids) req.add_chunk_ids(id);
    bool own_buffer;
    grpc::SerializationTraits<v1::PullRequest>::Serialize(req, &op->calls[i].request,
                                                          &own_buffer);
    op->calls[i].part = &parts_[i];
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
  op->calls.resize(parts_.size());
  for (size_t i = 0; i < parts_.size(); ++i) EncodePushCall(op.get(), i);
  return Wait(Register(std::move(op)), retry).status();
}

std::vector<ParameterClient::Part> ParameterClient::StateCalls(uint32_t slots) const {
  std::vector<std::vector<uint32_t>> by_shard(layout_.shards_size());
  for (const v1::ChunkSpec& c : layout_.chunks()) by_shard[c.shard()].push_back(c.chunk_id());
  std::vector<Part> calls;
  for (size_t shard = 0; shard < by_shard.size(); ++shard) {
    size_t bytes = 0;
    for (uint32_t id : by_shard[shard]) {
      const size_t chunk_bytes =
          layout_.chunks(id).num_elements() * sizeof(float) * std::max<uint32_t>(slots, 1);
      if (calls.empty() || calls.back().shard != shard || bytes + chunk_bytes > kStateCallBytes) {
        calls.push_back(Part{shard, 0, {}});
        bytes = 0;
      }
      calls.back().chunk_ids.push_back(id);
      bytes += chunk_bytes;
    }
  }
  return calls;
}

std::unique_ptr<v1::ParameterServer::Stub> ParameterClient::TypedStub(size_t shard) const {
  absl::MutexLock lock(&mu_);
  return v1::ParameterServer::NewStub(MakeChannel(endpoints_[shard].address()));
}

absl::StatusOr<ParameterClient::OptimizerState> ParameterClient::ReadOptimizerState(
    absl::Duration timeout) const {
  OptimizerState state;
  state.kind = config_.optimizer().kind();
  const uint32_t slots = OptimizerStateSlots(state.kind);
  state.slots.assign(slots, std::vector<float>(num_params_));
  std::vector<uint64_t> chunk_steps(layout_.chunks_size(), 0);
  for (const Part& call : StateCalls(slots)) {
    v1::GetOptimizerStateRequest request;
    request.set_job_id(config_.job_id());
    request.set_worker_rank(rank_);
    request.set_generation(generation_.load());
    for (uint32_t id : call.chunk_ids) request.add_chunk_ids(id);
    v1::GetOptimizerStateResponse reply;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    grpc::Status status = TypedStub(call.shard)->GetOptimizerState(&context, request, &reply);
    if (!status.ok())
      return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                          absl::StrCat("reading shard ", call.shard, "'s optimizer state: ",
                                       status.error_message()));
    if (reply.kind() != state.kind || reply.chunks_size() != request.chunk_ids_size())
      return absl::InternalError(absl::StrCat("shard ", call.shard, " answered the state of ",
                                              reply.chunks_size(), " chunks of ",
                                              OptimizerName(reply.kind()), ", not ",
                                              request.chunk_ids_size(), " of ",
                                              OptimizerName(state.kind)));
    for (int i = 0; i < reply.chunks_size(); ++i) {
      const v1::ChunkOptimizerState& c = reply.chunks(i);
      const uint32_t id = request.chunk_ids(i);
      const uint64_t n = layout_.chunks(id).num_elements();
      if (c.chunk_id() != id || static_cast<uint32_t>(c.slots_size()) != slots)
        return absl::InternalError(absl::StrCat("shard ", call.shard, " answered chunk ",
                                                c.chunk_id(), " with ", c.slots_size(),
                                                " slots for chunk ", id));
      for (uint32_t k = 0; k < slots; ++k) {
        const std::string& slot = c.slots(static_cast<int>(k));
        if (slot.size() != n * sizeof(float))
          return absl::InternalError(absl::StrCat("shard ", call.shard, " answered ",
                                                  slot.size(), " bytes of chunk ", id, "'s slot ",
                                                  k));
        std::memcpy(state.slots[k].data() + chunk_offset_[id], slot.data(), slot.size());
      }
      chunk_steps[id] = c.steps();
    }
  }
  for (const std::vector<uint32_t>& chunks : tensor_chunks_)
    state.steps.push_back(chunks.empty() ? 0 : chunk_steps[chunks.front()]);
  return state;
}

absl::Status ParameterClient::LoadOptimizerState(const OptimizerState& state,
                                                 absl::Duration timeout) const {
  const v1::OptimizerKind kind = config_.optimizer().kind();
  const uint32_t slots = OptimizerStateSlots(kind);
  if (state.kind != kind)
    return absl::InvalidArgumentError(absl::StrCat("the state is the ", OptimizerName(state.kind),
                                                   " optimizer's; the job keeps ",
                                                   OptimizerName(kind), "'s"));
  if (state.slots.size() != slots || state.steps.size() != tensor_chunks_.size())
    return absl::InvalidArgumentError(absl::StrCat(
        "the state has ", state.slots.size(), " slots and steps for ", state.steps.size(),
        " tensors; ", OptimizerName(kind), " has ", slots, ", the model ",
        tensor_chunks_.size(), " tensors"));
  for (const std::vector<float>& slot : state.slots)
    if (static_cast<int64_t>(slot.size()) != num_params_)
      return absl::InvalidArgumentError(absl::StrCat(
          "a state slot of ", slot.size(), " floats; the model has ", num_params_));
  for (const Part& call : StateCalls(slots)) {
    v1::LoadOptimizerStateRequest request;
    request.set_job_id(config_.job_id());
    request.set_worker_rank(rank_);
    request.set_incarnation(incarnation_);
    request.set_generation(generation_.load());
    request.set_kind(kind);
    for (uint32_t id : call.chunk_ids) {
      const v1::ChunkSpec& spec = layout_.chunks(id);
      v1::ChunkOptimizerState* c = request.add_chunks();
      c->set_chunk_id(id);
      c->set_steps(state.steps[spec.tensor_index()]);
      for (const std::vector<float>& slot : state.slots)
        c->add_slots(reinterpret_cast<const char*>(slot.data() + chunk_offset_[id]),
                     spec.num_elements() * sizeof(float));
    }
    v1::LoadOptimizerStateResponse reply;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    grpc::Status status = TypedStub(call.shard)->LoadOptimizerState(&context, request, &reply);
    if (!status.ok())
      return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                          absl::StrCat("loading shard ", call.shard, "'s optimizer state: ",
                                       status.error_message()));
  }
  return absl::OkStatus();
}

absl::Status ParameterClient::SetOptimizers(std::vector<v1::OptimizerConfig> optimizers,
                                           const std::vector<uint32_t>& by_tensor) {
  std::shared_ptr<ProgramOptimizers> set;
  if (!optimizers.empty() || !by_tensor.empty()) {
    if (by_tensor.size() != tensor_chunks_.size())
      return absl::InvalidArgumentError(absl::StrCat(
          "an optimizer for each of ", by_tensor.size(), " tensors; the model has ",
          tensor_chunks_.size()));
    set = std::make_shared<ProgramOptimizers>();
    set->by_chunk.assign(layout_.chunks_size(), 0);
    for (size_t t = 0; t < by_tensor.size(); ++t) {
      if (by_tensor[t] > optimizers.size())
        return absl::InvalidArgumentError(absl::StrCat(
            "tensor ", t, " names optimizer ", by_tensor[t], " of ", optimizers.size()));
      for (uint32_t id : tensor_chunks_[t]) set->by_chunk[id] = by_tensor[t];
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
    op->header.set_pull(true);
    op->header.set_pull_timeout_ms(static_cast<uint32_t>(
        std::max<int64_t>(1, absl::ToInt64Milliseconds(pull_timeout))));
    op->header.set_pull_dtype(config_.wire_dtype());
  }
  op->host_grads = host_grads;
  op->dtype = *DTypeFromWire(JobWireDType(config_), true, "push");
  op->host_params = pull_into;
  op->calls.resize(parts_.size());
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
    for (size_t i = 0; i < parts_.size(); ++i) EncodePushCall(op.get(), i);
    return Register(std::move(op));
  }
  const float topk = config_.gradient_topk();
  // Top-k: each part's selection is made once; a retry sends the same bytes.
  absl::MutexLock topk_lock(&topk_mu_);
  {
    if (residual_.empty() || residual_generation_ != header.generation()) {
      residual_.assign(num_params_, 0.0f);
      residual_step_.reset();
      residual_generation_ = header.generation();
    }
    if (residual_step_ == step) {
      residual_ = residual_before_;  // a retry: the same selection again
    } else {
      residual_before_ = residual_;
      residual_step_ = step;
    }
  }
  for (size_t i = 0; i < parts_.size(); ++i) {
    std::vector<WireChunk> chunks(parts_[i].chunk_ids.size());
    for (size_t k = 0; k < chunks.size(); ++k) {
      const uint32_t id = parts_[i].chunk_ids[k];
      const uint64_t n = layout_.chunks(id).num_elements();
      const float* values = host_grads + chunk_offset_[id];
      WireChunk& c = chunks[k];
      c.chunk_id = id;
      c.version = chunk_version_[id].load();
      if (op->optimizers != nullptr) c.optimizer = op->optimizers->by_chunk[id];
      const size_t keep = static_cast<size_t>(std::ceil(topk * static_cast<double>(n)));
      SparsifyTopK(values, residual_.data() + chunk_offset_[id], n, keep, d, &c.indices,
                   &c.owned, &topk_order_);
    }
    op->calls[i].request = EncodePushRequest(header, wire, std::move(chunks));
    op->calls[i].part = &parts_[i];
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
  op->started.assign(parts_.size(), false);
  op->tensor_ready.assign(tensor_chunks_.size(), false);
  for (const Part& part : parts_)
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
  for (uint32_t id : tensor_chunks_[tensor_index]) {
    const uint32_t part = part_of_chunk_[id];
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

void ParameterClient::EncodePushCall(Operation* op, size_t index) {
  Call& call = op->calls[index];
  const Part& part = parts_[index];
  call.part = &part;
  call.lane = nullptr;
  call.lane_bytes = 0;
  if (!op->header.initial_values()) {  // those travel in the message
    absl::MutexLock lock(&lane_mu_);
    if (lane_ != nullptr && !lane_refused_[part.shard] && !lane_->busy[index].exchange(true))
      call.lane = lane_;
  }
  v1::PushRequest header = op->header;
  uint64_t at = 0;
  if (call.lane != nullptr) {
    v1::SharedLane* ref = header.mutable_lane();
    *ref = call.lane->segment->Ref();
    ref->set_doorbell_offset(call.lane->doorbell_offset[part.shard]);
    ref->set_doorbell_slots(call.lane->doorbell[part.shard].slots());
    ref->set_doorbell_slot_bytes(call.lane->slot_bytes);
    at = call.lane->place[index];
    if (header.pull()) header.mutable_lane()->set_reply_offset(at);
  }
  const DType d = op->dtype;
  std::vector<WireChunk> chunks(part.chunk_ids.size());
  for (size_t k = 0; k < chunks.size(); ++k) {
    const uint32_t id = part.chunk_ids[k];
    const uint64_t n = layout_.chunks(id).num_elements();
    const float* values = op->host_grads + chunk_offset_[id];
    WireChunk& c = chunks[k];
    c.chunk_id = id;
    c.version = chunk_version_[id].load();
    if (op->optimizers != nullptr) c.optimizer = op->optimizers->by_chunk[id];
    if (call.lane != nullptr) {
      // The one copy of the push: into the lane, where the shard reads it.
      ConvertElements(values, DType::kF32, call.lane->segment->base() + at, d, n);
      c.lane_offset = at;
      at += n * DTypeSize(d);
      call.lane_bytes += n * DTypeSize(d);
    } else if (d == DType::kF32) {
      c.external = values;
      c.external_bytes = n * sizeof(float);
    } else {
      c.owned.resize(n * DTypeSize(d));
      ConvertElements(values, DType::kF32, c.owned.data(), d, n);
    }
  }
  call.request = EncodePushRequest(header, DTypeToWire(d), std::move(chunks));
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
  if (op->staged)
    for (size_t i = 0; i < op->calls.size(); ++i)
      if (!op->started[i]) StartStaged(op.get(), i);
  const absl::Time give_up = absl::Now() + retry.retry_for;
  absl::Duration backoff = retry.initial_backoff;
  bool retried = false;
  while (true) {
    std::vector<size_t> again, refused;
    absl::Status first;
    {
      AwaitCalls(op.get());
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
        if (op->push && !retried && op->replied_bytes >= kMinCredit)
          credit_.store(CreditFor(op->replied_bytes, op->last_reply - op->first_start,
                                  op->shortest));
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
      if (op->calls[i].lane != nullptr) EncodePushCall(op.get(), i);
      StartCall(op.get(), i);
    }
  }
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
