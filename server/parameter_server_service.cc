#include "server/parameter_server_service.h"

#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "daemon/daemon.h"
#include "daemon/refusal_log.h"
#include "job/job_config.h"
#include "job/sparse_tables.h"
#include "server/chunk_optimizer.h"
#include "spdlog/spdlog.h"
#include "tensor/dtype.h"
#include "wire/buffer_pool.h"
#include "wire/chunk_codec.h"
#include "wire/lane_doorbell.h"

namespace grps {
namespace {

absl::Status NotReady() {
  return absl::UnavailableError(
      "shard not ready: still registering with the coordinator");
}

absl::Status CheckJob(const ShardStore& store, const std::string& job_id) {
  if (job_id == store.config().job_id()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("request for job '", QuoteUntrusted(job_id),
                   "' but this shard serves job '",
                   store.config().job_id(), "'"));
}

absl::Status CheckRank(const ShardStore& store, uint32_t rank) {
  if (rank < JobRanks(store.config())) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("unknown worker rank ", rank, ": the job has ",
                   JobRanks(store.config()), " workers"));
}

// A chunk or row this shard does not hold: NOT_FOUND, unless the request
// is of another generation than the shard's, whose map may place it
// otherwise (a re-sharded job): a worker that heard of the new map before
// the shard rebuilt is told to retry (UNAVAILABLE), and a request of the
// map the job rolled back from is refused as of an older generation
// (ABORTED), as the store would.
absl::Status NotHeld(const ShardStore& store, uint64_t generation, std::string what) {
  if (absl::Status s = store.CheckGeneration(generation); !s.ok()) return s;
  return absl::NotFoundError(std::move(what));
}

// The spec of a chunk this shard holds; NOT_FOUND otherwise (NotHeld).
absl::StatusOr<const v1::ChunkSpec*> CheckChunk(const ShardStore& store, uint32_t chunk_id,
                                                uint64_t generation) {
  const v1::ShardMap& map = store.shard_map();
  if (chunk_id >= static_cast<uint32_t>(map.chunks_size()))
    return absl::NotFoundError(absl::StrCat(
        "unknown chunk ", chunk_id, ": the model has ", map.chunks_size(),
        " chunks"));
  const v1::ChunkSpec& spec = map.chunks(chunk_id);
  if (spec.shard() != store.shard())
    return NotHeld(store, generation,
                   absl::StrCat("chunk ", chunk_id, " is held by shard ", spec.shard(),
                                ", not shard ", store.shard()));
  return &spec;
}

// The bits of kMaxGradientMagnitude: a float is NaN, infinite or larger in
// magnitude when the bits of its |v| are above them (NaN and infinity have
// the largest), a test with no branch, so loops of it vectorize.
uint32_t GradientLimitBits() {
  uint32_t bits;
  const float max = ParameterServerService::kMaxGradientMagnitude;
  std::memcpy(&bits, &max, sizeof(bits));
  return bits;
}
bool OutOfRangeBits(uint32_t bits, uint32_t limit) { return (bits & 0x7fffffffu) > limit; }

// Index of the first element of `values` that is out of range
// (OutOfRangeBits), or -1.
int64_t FirstOutOfRange(absl::Span<const float> values) {
  const uint32_t limit = GradientLimitBits();
  uint32_t any = 0;
  for (float v : values) {
    uint32_t bits;
    std::memcpy(&bits, &v, sizeof(bits));
    any |= static_cast<uint32_t>(OutOfRangeBits(bits, limit));
  }
  if (any == 0) return -1;
  for (size_t i = 0; i < values.size(); ++i) {
    uint32_t bits;
    std::memcpy(&bits, &values[i], sizeof(bits));
    if (OutOfRangeBits(bits, limit)) return static_cast<int64_t>(i);
  }
  return -1;
}

// Copies n f32 values from `src` (the worker's lane: any alignment) to
// `dst` and returns FirstOutOfRange of the copy, in one pass over both.
int64_t CopyFirstOutOfRange(const char* src, float* dst, size_t n) {
  const uint32_t limit = GradientLimitBits();
  uint32_t any = 0;
  for (size_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, src + i * sizeof(float), sizeof(bits));
    any |= static_cast<uint32_t>(OutOfRangeBits(bits, limit));
    std::memcpy(dst + i, &bits, sizeof(bits));
  }
  return any == 0 ? -1 : FirstOutOfRange(absl::MakeConstSpan(dst, n));
}

// Gradients converted to f32 live here between validation and the store.
// One per gRPC thread, grown and reused, so a steady stream of pushes
// allocates nothing.
std::vector<float>& ScratchBuffer() {
  thread_local std::vector<float> scratch;
  return scratch;
}

// One received chunk of a push, checked: its spec, its dtype, and where its
// values are.
struct CheckedChunk {
  const v1::ChunkSpec* spec;
  DType dtype;
  const char* in_lane;  // the values in the lane, or null: in the message
};

// Checks one received chunk against the shard's map, the chunks `seen`
// before it in the push (it joins them) and the push's lane (may be null):
// a chunk of this shard, once, a known dtype, sparse indices that fit, and
// as many bytes as its values need, in the message or the lane.
absl::StatusOr<CheckedChunk> CheckReceivedChunk(const ShardStore& store, uint64_t generation,
                                                const ReceivedChunk& chunk,
                                                const MappedLane* lane,
                                                absl::flat_hash_set<uint32_t>* seen) {
  const std::string what = absl::StrCat("chunk ", chunk.chunk_id);
  absl::StatusOr<const v1::ChunkSpec*> spec = CheckChunk(store, chunk.chunk_id, generation);
  if (!spec.ok()) return spec.status();
  if (!seen->insert(chunk.chunk_id).second)
    return absl::InvalidArgumentError(absl::StrCat(what, " appears twice in one push"));
  absl::StatusOr<DType> dtype = DTypeFromWire(chunk.dtype, false, what);
  if (!dtype.ok()) return dtype.status();
  const uint64_t n = (*spec)->num_elements();
  // A sparse gradient (top-k) carries one value per index.
  const bool sparse = !chunk.indices.AtEnd();
  const uint64_t count = sparse ? chunk.indices.left() / sizeof(uint32_t) : n;
  if (sparse && (chunk.indices.left() % sizeof(uint32_t) != 0 || count > n))
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": ", chunk.indices.left(), " bytes of indices for ", n, " elements"));
  const uint64_t expected = count * DTypeSize(*dtype);
  if (chunk.lane_offset != 0) {
    if (lane == nullptr || sparse || !chunk.data.AtEnd())
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": a lane offset needs the push's lane, whole values and no data"));
    absl::StatusOr<char*> at = lane->At(chunk.lane_offset, expected);
    if (!at.ok()) return absl::InvalidArgumentError(absl::StrCat(what, ": ", at.status().message()));
    return CheckedChunk{*spec, *dtype, *at};
  }
  if (chunk.data.left() != expected)
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": expected ", expected, " bytes (", count, " x ",
        std::string(DTypeName(*dtype)), "), got ", chunk.data.left()));
  return CheckedChunk{*spec, *dtype, nullptr};
}

// Copies a checked chunk's gradient, as f32, into `dst` (num_elements
// floats) and checks every value: INVALID_ARGUMENT for one out of range.
absl::Status ReadCheckedGradient(ReceivedChunk& chunk, const CheckedChunk& c, float* dst) {
  thread_local std::string narrow;  // f16 / bf16 payloads on their way to f32
  const size_t n = c.spec->num_elements();
  int64_t bad = -1;
  if (c.in_lane != nullptr && c.dtype == DType::kF32) {
    // The one copy out of the worker's memory, checked as it is made;
    // what is checked is this copy, whatever the worker writes meanwhile.
    bad = CopyFirstOutOfRange(c.in_lane, dst, n);
  } else {
    if (c.in_lane != nullptr) {
      ConvertElements(c.in_lane, c.dtype, dst, DType::kF32, n);
    } else if (absl::Status s = ReadGradient(chunk, c.dtype, dst, n, &narrow); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunk ", chunk.chunk_id, ": ", s.message()));
    }
    bad = FirstOutOfRange(absl::MakeConstSpan(dst, n));
  }
  if (bad < 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "chunk ", chunk.chunk_id, ": gradient element ", bad, " is ", dst[bad],
      " (NaN, infinity and magnitudes above ", ParameterServerService::kMaxGradientMagnitude,
      " are refused: they would overflow the sum or the weights)"));
}

// Validates a whole push and turns it into a typed one. The returned spans
// point into `scratch`, which must outlive the result. `lane` (may be null)
// is the push's mapped lane: a chunk with a lane_offset is read from it.
absl::StatusOr<ShardStore::GradientPush> DecodePush(
    const ShardStore& store, const v1::PushRequest& header,
    std::vector<ReceivedChunk>& chunks, const MappedLane* lane,
    std::vector<float>* scratch) {
  if (absl::Status s = CheckJob(store, header.job_id()); !s.ok()) return s;
  if (absl::Status s = CheckRank(store, header.worker_rank()); !s.ok())
    return s;
  if (chunks.empty())
    return absl::InvalidArgumentError("push carries no chunks");
  if (header.num_samples() == 0)
    return absl::InvalidArgumentError(
        "push says its gradients come from 0 samples (num_samples must be at least 1)");
  for (int i = 0; i < header.optimizers_size(); ++i)
    if (absl::Status s = CheckProgramOptimizer(store.config().optimizer(), header.optimizers(i));
        !s.ok())
      return absl::InvalidArgumentError(absl::StrCat("optimizer ", i + 1, ": ", s.message()));
  std::vector<CheckedChunk> checked;
  checked.reserve(chunks.size());
  absl::flat_hash_set<uint32_t> seen;
  size_t scratch_floats = 0;
  for (const ReceivedChunk& chunk : chunks) {
    absl::StatusOr<CheckedChunk> c =
        CheckReceivedChunk(store, header.generation(), chunk, lane, &seen);
    if (!c.ok()) return c.status();
    if (chunk.optimizer > static_cast<uint32_t>(header.optimizers_size()))
      return absl::InvalidArgumentError(absl::StrCat(
          "chunk ", chunk.chunk_id, " names optimizer ", chunk.optimizer, " of ",
          header.optimizers_size()));
    scratch_floats += c->spec->num_elements();
    checked.push_back(*c);
  }

  // Every gradient is copied once, out of the received slices, into the
  // thread's reused scratch (sized once, so the spans below stay valid).
  if (scratch->size() < scratch_floats) scratch->resize(scratch_floats);
  ShardStore::GradientPush push;
  push.worker_rank = header.worker_rank();
  push.incarnation = header.incarnation();
  push.step = header.step();
  push.generation = header.generation();
  push.chunks.reserve(checked.size());
  float* dst = scratch->data();
  for (size_t i = 0; i < chunks.size(); ++i) {
    ReceivedChunk& chunk = chunks[i];
    const CheckedChunk& c = checked[i];
    const size_t n = c.spec->num_elements();
    ShardStore::ChunkGradient& g = push.chunks.emplace_back();
    g.chunk_id = chunk.chunk_id;
    g.base_version = chunk.version;
    if (chunk.optimizer != 0) g.optimizer = &header.optimizers(static_cast<int>(chunk.optimizer) - 1);
    g.wire_bytes = c.in_lane != nullptr ? n * DTypeSize(c.dtype)
                                        : chunk.data.left() + chunk.indices.left();
    if (absl::Status s = ReadCheckedGradient(chunk, c, dst); !s.ok()) return s;
    g.values = absl::MakeConstSpan(dst, n);
    dst += n;
  }
  return push;
}

// Parses a small request message (protobuf copies its few bytes once).
template <typename Message>
bool ParseRequest(const grpc::ByteBuffer& bytes, Message* message) {
  grpc::ByteBuffer copy(bytes);  // shares the slices
  return grpc::SerializationTraits<Message>::Deserialize(&copy, message).ok();
}

// What a pull read, handed to the reply without a copy; `lane_offsets`
// (empty, or one per chunk) says where in the caller's lane each chunk's
// values already are.
std::vector<WireChunk> ToWireChunks(std::vector<ShardStore::PulledChunk>& pulled,
                                    const std::vector<uint64_t>& lane_offsets = {}) {
  std::vector<WireChunk> chunks(pulled.size());
  for (size_t i = 0; i < chunks.size(); ++i) {
    chunks[i].chunk_id = pulled[i].chunk_id;
    chunks[i].version = pulled[i].version;
    chunks[i].owned = std::move(pulled[i].data);
    chunks[i].recycle = &BufferPool::Default();
    if (!lane_offsets.empty()) chunks[i].lane_offset = lane_offsets[i];
  }
  return chunks;
}

// Where the pull half of a push writes each pushed chunk's values in the
// push's lane: back to back from lane.reply_offset, in `dtype`. Fills
// `offsets` and `into`; INVALID_ARGUMENT when they do not fit the lane.
absl::Status ReplyPlaces(const ShardStore& store, const ShardStore::GradientPush& push,
                         const v1::SharedLane& ref, const MappedLane& lane, DType dtype,
                         std::vector<uint64_t>* offsets, std::vector<char*>* into) {
  uint64_t at = ref.reply_offset();
  for (const ShardStore::ChunkGradient& g : push.chunks) {
    const uint64_t bytes = store.shard_map().chunks(g.chunk_id).num_elements() * DTypeSize(dtype);
    absl::StatusOr<char*> place = lane.At(at, bytes);
    if (!place.ok())
      return absl::InvalidArgumentError(
          absl::StrCat("reply of chunk ", g.chunk_id, ": ", place.status().message()));
    offsets->push_back(at);
    into->push_back(*place);
    at += bytes;
  }
  return absl::OkStatus();
}

// A push past the edge's checks, with its pull half's dtype and, for a push
// whose reply goes into its lane, the places there.
struct CheckedPush {
  ShardStore::GradientPush push;
  DType pull_dtype = DType::kF32;
  std::vector<uint64_t> reply_offsets;
  std::vector<char*> reply_into;
};

// DecodePush, the pull half's dtype and its places in the lane (may be
// null), all checked before anything changes.
absl::StatusOr<CheckedPush> CheckPush(const ShardStore& store, const v1::PushRequest& request,
                                      std::vector<ReceivedChunk>& chunks,
                                      const MappedLane* lane) {
  absl::StatusOr<ShardStore::GradientPush> push =
      DecodePush(store, request, chunks, lane, &ScratchBuffer());
  if (!push.ok()) return push.status();
  absl::StatusOr<DType> pull_dtype =
      DTypeFromWire(request.pull_dtype(), true, "push's pull_dtype");
  if (!pull_dtype.ok()) return pull_dtype.status();
  CheckedPush checked;
  checked.push = std::move(*push);
  checked.pull_dtype = *pull_dtype;
  if (request.pull() && lane != nullptr && request.lane().reply_offset() != 0)
    if (absl::Status s = ReplyPlaces(store, checked.push, request.lane(), *lane,
                                     checked.pull_dtype, &checked.reply_offsets,
                                     &checked.reply_into);
        !s.ok())
      return s;
  return checked;
}

// The header of the reply to a push the store took.
v1::PushResponse PushReplyHeader(const ShardStore::PushResult& result) {
  v1::PushResponse header;
  for (uint64_t v : result.versions) header.add_versions(v);
  header.set_duplicates(result.duplicates);
  header.set_late(result.late);
  header.set_too_stale(result.too_stale);
  return header;
}

// A call's deadline; InfiniteFuture for none.
absl::Time CallDeadline(const grpc::ServerContextBase& context) {
  const auto deadline = context.deadline();
  return deadline == std::chrono::system_clock::time_point::max() ? absl::InfiniteFuture()
                                                                  : absl::FromChrono(deadline);
}

// The end of a pull's wait: now + timeout_ms (0: now, no wait), never past
// `call_deadline` or kMaxPullWait.
absl::Time PullDeadline(absl::Time call_deadline, uint32_t timeout_ms) {
  const absl::Time now = absl::Now();
  return std::min({now + ParameterServerService::kMaxPullWait,
                   now + absl::Milliseconds(timeout_ms), call_deadline});
}

// The pull half of a push the store took: the pushed chunks at the
// worker's next clock, in the reply after `header`; without values when
// they are not ready in time (the push stands; the worker pulls). The lane
// stays mapped until the values are written.
void ServePullHalf(ShardStore* store, const v1::PushRequest& request, CheckedPush checked,
                   absl::Time call_deadline, std::shared_ptr<const std::atomic<bool>> cancelled,
                   v1::PushResponse header, std::shared_ptr<MappedLane> lane,
                   std::function<void(grpc::Status, grpc::ByteBuffer)> done) {
  ShardStore::PullSpec spec;
  spec.worker_rank = request.worker_rank();
  for (const ShardStore::ChunkGradient& g : checked.push.chunks)
    spec.chunk_ids.push_back(g.chunk_id);
  spec.clock = request.step() + 1;
  spec.generation = request.generation();
  spec.dtype = checked.pull_dtype;
  spec.deadline = PullDeadline(call_deadline, std::max<uint32_t>(1, request.pull_timeout_ms()));
  spec.cancelled = std::move(cancelled);
  spec.into = std::move(checked.reply_into);
  store->PullAsync(
      std::move(spec),
      [done = std::move(done), header = std::move(header), wire = DTypeToWire(checked.pull_dtype),
       lane = std::move(lane), reply_offsets = std::move(checked.reply_offsets)](
          absl::StatusOr<std::vector<ShardStore::PulledChunk>> pulled) {
        if (lane != nullptr) lane->Wrote();  // the values in it, before the answer
        done(grpc::Status::OK,
             EncodePushResponse(header, wire,
                                pulled.ok() ? ToWireChunks(*pulled, reply_offsets)
                                            : std::vector<WireChunk>()));
      });
}

// A unary call that may wait in the store as a pull: when the client
// cancels (or its channel closes), the wait ends at once with CANCELLED
// instead of holding its waiter until the deadline.
class PullReactor final : public grpc::ServerUnaryReactor {
 public:
  explicit PullReactor(ShardStore* store) : store_(store) {}

  // For PullSpec.cancelled.
  std::shared_ptr<const std::atomic<bool>> cancelled() const { return cancelled_; }

  void OnCancel() override {
    // Through a copy: its release orders this store before the flag is
    // freed, in a way ThreadSanitizer sees (gRPC's own ordering of OnCancel
    // before OnDone, on another thread, it cannot).
    const std::shared_ptr<std::atomic<bool>> flag = cancelled_;
    flag->store(true);
    if (store_ != nullptr) store_->WakePulls();
  }
  void OnDone() override { delete this; }

 private:
  ShardStore* const store_;
  const std::shared_ptr<std::atomic<bool>> cancelled_ =
      std::make_shared<std::atomic<bool>>(false);
};

}  // namespace

namespace {

// The checks of a pull that need no waiting; the typed spec, or why not.
absl::StatusOr<ShardStore::PullSpec> DecodePull(const ShardStore& store,
                                                const v1::PullRequest& request,
                                                absl::Time deadline) {
  if (absl::Status s = CheckJob(store, request.job_id()); !s.ok()) return s;
  if (absl::Status s = CheckRank(store, request.worker_rank()); !s.ok())
    return s;
  absl::StatusOr<DType> dtype = DTypeFromWire(request.dtype(), true, "pull");
  if (!dtype.ok()) return dtype.status();
  ShardStore::PullSpec spec;
  spec.worker_rank = request.worker_rank();
  spec.chunk_ids.assign(request.chunk_ids().begin(), request.chunk_ids().end());
  if (spec.chunk_ids.empty()) spec.chunk_ids = store.chunk_ids();
  absl::flat_hash_set<uint32_t> seen;
  uint64_t reply_bytes = 0;
  for (uint32_t id : spec.chunk_ids) {
    absl::StatusOr<const v1::ChunkSpec*> chunk = CheckChunk(store, id, request.generation());
    if (!chunk.ok()) return chunk.status();
    if (!seen.insert(id).second)
      return absl::InvalidArgumentError(
          absl::StrCat("chunk ", id, " appears twice in one pull"));
    // Payload plus a generous allowance for the framing of each chunk.
    reply_bytes += (*chunk)->num_elements() * DTypeSize(*dtype) + 32;
  }
  if (reply_bytes > static_cast<uint64_t>(kMaxMessageBytes))
    return absl::ResourceExhaustedError(absl::StrCat(
        "pull reply of ", reply_bytes, " bytes exceeds the ", kMaxMessageBytes,
        "-byte message limit; pull fewer chunks per call"));
  spec.min_version = request.min_version();
  if (request.has_clock()) spec.clock = request.clock();
  spec.generation = request.generation();
  spec.deadline = deadline;
  spec.dtype = *dtype;
  return spec;
}

}  // namespace

grpc::ServerUnaryReactor* ParameterServerService::Pull(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request_bytes,
    grpc::ByteBuffer* response) {
  // The call may wait: its reactor hears a cancellation.
  ShardStore* store = store_.load();
  auto* reactor = new PullReactor(store);
  if (store == nullptr) {
    reactor->Finish(ToGrpc(NotReady()));
    return reactor;
  }
  if (!request_bytes->Valid()) {  // as in Push
    reactor->Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the pull's message never arrived"));
    return reactor;
  }
  v1::PullRequest request;
  if (!ParseRequest(*request_bytes, &request)) {
    reactor->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                 "pull request is not a PullRequest"));
    return reactor;
  }
  absl::StatusOr<ShardStore::PullSpec> spec =
      DecodePull(*store, request, PullDeadline(CallDeadline(*context), request.timeout_ms()));
  if (!spec.ok()) {
    reactor->Finish(ToGrpc(spec.status()));
    return reactor;
  }
  const v1::DType wire = DTypeToWire(spec->dtype);
  spec->cancelled = reactor->cancelled();
  // The reactor and the response live until Finish; the store calls back
  // exactly once.
  store->PullAsync(
      std::move(*spec),
      [reactor, response,
       wire](absl::StatusOr<std::vector<ShardStore::PulledChunk>> pulled) {
        if (!pulled.ok()) {
          reactor->Finish(ToGrpc(pulled.status()));
          return;
        }
        *response = EncodePullResponse(wire, ToWireChunks(*pulled));
        reactor->Finish(grpc::Status::OK);
      });
  return reactor;
}

grpc::ServerUnaryReactor* ParameterServerService::Push(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request_bytes,
    grpc::ByteBuffer* response) {
  // A push with a pull may wait: its reactor hears a cancellation.
  ShardStore* store = store_.load();
  auto* reactor = new PullReactor(store);
  if (store == nullptr) {
    reactor->Finish(ToGrpc(NotReady()));
    return reactor;
  }
  if (!request_bytes->Valid()) {
    // gRPC calls the handler without a message when the transport could not
    // read it (the memory quota reset the stream): the client sees that
    // failure, not this answer; nothing was refused.
    reactor->Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the push's message never arrived"));
    return reactor;
  }
  PushSource source;
  source.context = context;
  ServePush(store, *request_bytes, source, reactor->cancelled(),
            [reactor, response](grpc::Status status, grpc::ByteBuffer reply) {
              if (status.ok()) *response = std::move(reply);
              reactor->Finish(status);
            });
  return reactor;
}

// A doorbell this shard serves: a worker's lane, the area in it, and who
// proved to own it when it opened.
struct ParameterServerService::Doorbell {
  Doorbell(uint32_t rank, uint64_t incarnation, std::shared_ptr<MappedLane> lane,
           const v1::SharedLane& ref, char* area)
      : rank(rank), incarnation(incarnation), lane(std::move(lane)), ref(ref),
        bell(area, ref.doorbell_slots(), ref.doorbell_slot_bytes()),
        busy(std::make_unique<std::atomic<bool>[]>(ref.doorbell_slots())),
        served(ref.doorbell_slots()) {
    for (uint32_t i = 0; i < ref.doorbell_slots(); ++i) {
      busy[i].store(false);
      // Requests rung before the doorbell opened were not meant for it.
      served[i] = bell.request_seq(i);
    }
  }

  const uint32_t rank;
  const uint64_t incarnation;
  const std::shared_ptr<MappedLane> lane;  // mapped while anything serves it
  const v1::SharedLane ref;
  LaneDoorbell bell;
  std::unique_ptr<std::atomic<bool>[]> busy;  // a slot's request is being served
  std::vector<uint32_t> served;               // the thread's: last sequence taken
  std::atomic<bool> stop{false};
  // Set at stop: a push of this doorbell waiting in the store ends.
  const std::shared_ptr<std::atomic<bool>> cancelled = std::make_shared<std::atomic<bool>>(false);
  std::thread thread;
};

absl::StatusOr<std::shared_ptr<MappedLane>> ParameterServerService::PushLane(
    ShardStore& store, const v1::PushRequest& request, size_t chunks,
    const PushSource& source) {
  if (const Doorbell* doorbell = source.doorbell.get(); doorbell != nullptr) {
    // Only the worker that opened the doorbell rings it, on its own lane.
    if (request.worker_rank() != doorbell->rank ||
        request.incarnation() != doorbell->incarnation || !request.has_lane() ||
        !doorbell->lane->Names(request.lane())) {
      store.CountRejectedAtEdge(std::max<size_t>(1, chunks));
      return absl::PermissionDeniedError(
          absl::StrCat("a push rung at the doorbell of worker ", doorbell->rank,
                       " must come from that worker's incarnation on its lane"));
    }
    return doorbell->lane;
  }
  if (!request.has_lane()) return nullptr;
  absl::StatusOr<std::shared_ptr<MappedLane>> mapped = LaneOf(store, *source.context, request);
  if (!mapped.ok() && !absl::IsUnimplemented(mapped.status()))
    store.CountRejectedAtEdge(std::max<uint64_t>(1, chunks));
  return mapped;
}

void ParameterServerService::ServePush(ShardStore* store, const grpc::ByteBuffer& bytes,
                                       const PushSource& source,
                                       std::shared_ptr<const std::atomic<bool>> cancelled,
                                       PushDone done) {
  v1::PushRequest request;  // the scalar fields; chunks stay in the slices
  std::vector<ReceivedChunk> chunks;
  if (absl::Status s = DecodePushRequest(bytes, &request,
                                         [&chunks](ReceivedChunk& c) {
                                           chunks.push_back(std::move(c));
                                           return absl::OkStatus();
                                         });
      !s.ok()) {
    store->CountRejectedAtEdge(1);
    done(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                      absl::StrCat("push request is not a PushRequest: ", s.message())),
         {});
    return;
  }
  absl::StatusOr<std::shared_ptr<MappedLane>> lane =
      PushLane(*store, request, chunks.size(), source);
  if (!lane.ok()) {
    done(ToGrpc(lane.status()), {});
    return;
  }
  absl::StatusOr<CheckedPush> checked = CheckPush(*store, request, chunks, lane->get());
  if (!checked.ok()) {
    store->CountRejectedAtEdge(std::max<uint64_t>(1, chunks.size()));
    done(ToGrpc(checked.status()), {});
    return;
  }
  // Only the member that registered as this rank's incarnation may push as
  // it (checked before the store admits the incarnation; LaneOf has
  // checked it for a push with a lane, and the doorbell's opening for its
  // pushes).
  if (*lane == nullptr) {
    if (grpc::Status member = CheckMemberSecret(
            member_key_, store->config().job_id(), MemberKind::kWorker,
            request.worker_rank(), request.incarnation(), CallerMemberSecret(*source.context));
        !member.ok()) {
      store->CountRejectedAtEdge(chunks.size());
      done(member, {});
      return;
    }
  }
  if (request.initial_values()) {
    grpc::Status given = GiveInitialValues(store, request, checked->push, lane->get());
    done(given, given.ok() ? EncodePushResponse(v1::PushResponse(), v1::DTYPE_F32, {})
                           : grpc::ByteBuffer());
    return;
  }
  absl::StatusOr<ShardStore::PushResult> result = store->Push(checked->push);
  if (!result.ok()) {
    done(ToGrpc(result.status()), {});
    return;
  }
  // A call seen before may be a retry (the worker sends one on a fresh lane)
  // or a copy the network made: its place in the lane may belong to a newer
  // call by now, so its values come back in the message. Not so a push rung
  // at a doorbell, even a duplicate (a worker that rolled back pushes its
  // steps again): its slot takes each request once, and the place it names
  // is its caller's until the answer (a worker that gives up on an answer
  // retires the lane), so its values go there as any rung push's do. In the
  // message they would not fit the slot: the worker would retire its lane
  // and retry through gRPC for every duplicate.
  if (result->duplicates > 0 && source.doorbell == nullptr) {
    checked->reply_offsets.clear();
    checked->reply_into.clear();
  }
  v1::PushResponse header = PushReplyHeader(*result);
  if (source.doorbell == nullptr && *lane != nullptr && request.lane().doorbell_offset() != 0)
    header.set_doorbell(ServeDoorbell(store, request, *lane));
  if (!request.pull()) {
    done(grpc::Status::OK, EncodePushResponse(header, DTypeToWire(checked->pull_dtype), {}));
    return;
  }
  ServePullHalf(store, request, std::move(*checked),
                source.context != nullptr ? CallDeadline(*source.context) : absl::InfiniteFuture(),
                std::move(cancelled), std::move(header), std::move(*lane), std::move(done));
}

grpc::Status ParameterServerService::GiveInitialValues(ShardStore* store,
                                                      const v1::PushRequest& request,
                                                      const ShardStore::GradientPush& push,
                                                      const MappedLane* lane) {
  if (lane != nullptr || request.pull()) {
    store->CountRejectedAtEdge(std::max<size_t>(1, push.chunks.size()));
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "initial values travel in the message, with no lane and no pull");
  }
  absl::StatusOr<uint32_t> taken = store->GiveInitialValues(push);
  if (!taken.ok()) return ToGrpc(taken.status());
  if (*taken > 0)
    spdlog::info("shard {}: {} chunks took worker rank 0's initial values", store->shard(),
                 *taken);
  return grpc::Status::OK;
}

bool ParameterServerService::ServeDoorbell(ShardStore* store, const v1::PushRequest& request,
                                           std::shared_ptr<MappedLane> lane) {
  const v1::SharedLane& ref = request.lane();
  if (!LaneDoorbell::CheckGeometry(ref.doorbell_slots(), ref.doorbell_slot_bytes()).ok() ||
      ref.doorbell_offset() % 64 != 0)
    return false;
  absl::StatusOr<char*> area = lane->At(
      ref.doorbell_offset(),
      LaneDoorbell::AreaBytes(ref.doorbell_slots(), ref.doorbell_slot_bytes()));
  if (!area.ok()) return false;
  std::shared_ptr<Doorbell> old;
  {
    absl::MutexLock lock(&doorbells_mu_);
    if (doorbells_stopped_) return false;
    if (!beater_.joinable()) beater_ = std::thread(&ParameterServerService::BeatLoop, this);
    std::shared_ptr<Doorbell>& served = doorbells_[request.worker_rank()];
    if (served != nullptr && served->lane == lane &&
        served->incarnation == request.incarnation() &&
        served->ref.doorbell_offset() == ref.doorbell_offset() &&
        served->ref.doorbell_slots() == ref.doorbell_slots() &&
        served->ref.doorbell_slot_bytes() == ref.doorbell_slot_bytes())
      return !served->stop.load();
    old = std::move(served);
    served = std::make_shared<Doorbell>(request.worker_rank(), request.incarnation(), lane, ref,
                                        *area);
    served->thread = std::thread(&ParameterServerService::DoorbellLoop, this, store, served);
  }
  if (old != nullptr) {
    old->stop.store(true);
    old->bell.Wake();
    old->thread.join();
  }
  return true;
}

namespace {

// A refused rung push goes to the log that gRPC's refused calls go to.
void NoteRefusedRing(uint32_t rank, grpc::StatusCode code, absl::string_view message) {
  RefusalLog::Process().Note("/grps.v1.ParameterServer/Push (rung at a lane doorbell)", code,
                             absl::StrCat("worker ", rank, "'s lane"), message);
}

}  // namespace

void ParameterServerService::DoorbellLoop(ShardStore* store, std::shared_ptr<Doorbell> d) {
  pthread_setname_np(pthread_self(), "grps-doorbell");
  while (!d->stop.load()) {
    // A worker that replaced its lane (a failed call, a restart) rings the
    // new one's doorbell; this one is done (and beats no more).
    if (!lanes_.IsCurrent(d->rank, d->lane.get())) {
      d->stop.store(true);
      break;
    }
    // The rings are noted before the slots are looked at: one rung after
    // the note ends the wait below at once, so none is missed.
    const uint32_t seen = d->bell.rings();
    for (uint32_t slot = 0; slot < d->bell.slots(); ++slot) {
      const uint32_t seq = d->bell.request_seq(slot);
      // One request per slot at a time: one rung before its answer waits.
      if (seq == d->served[slot] || d->busy[slot].load()) continue;
      d->served[slot] = seq;
      d->busy[slot].store(true);
      doorbell_pushes_.fetch_add(1);
      PushDone answer = [d, slot, seq](grpc::Status status, grpc::ByteBuffer reply) {
        if (IsRefusal(status.error_code()))
          NoteRefusedRing(d->rank, status.error_code(), status.error_message());
        // Free before the answer: the worker may ring the slot again as soon
        // as it has read it.
        d->busy[slot].store(false);
        d->bell.Answer(slot, seq, ToAbsl(status), reply);
      };
      grpc::ByteBuffer request;
      if (absl::Status s = d->bell.TakeRequest(slot, &request); !s.ok()) {
        store->CountRejectedAtEdge(1);
        answer(ToGrpc(s), {});
        continue;
      }
      PushSource source;
      source.doorbell = d;
      ServePush(store, request, source, d->cancelled, std::move(answer));
    }
    d->bell.AwaitRing(seen, kDoorbellBeat);
  }
}

void ParameterServerService::BeatLoop() {
  pthread_setname_np(pthread_self(), "grps-beat");
  absl::MutexLock lock(&doorbells_mu_);
  while (!doorbells_stopped_) {
    for (auto& [rank, d] : doorbells_)
      if (!d->stop.load()) d->bell.Beat();
    beat_wake_.WaitWithTimeout(&doorbells_mu_, kDoorbellBeat);
  }
}

void ParameterServerService::StopDoorbells() {
  absl::flat_hash_map<uint32_t, std::shared_ptr<Doorbell>> served;
  std::thread beater;
  {
    absl::MutexLock lock(&doorbells_mu_);
    doorbells_stopped_ = true;
    served.swap(doorbells_);
    beater.swap(beater_);
    beat_wake_.Signal();
  }
  if (beater.joinable()) beater.join();
  for (auto& [rank, d] : served) {
    d->stop.store(true);
    d->cancelled->store(true);
    d->bell.Wake();
  }
  if (ShardStore* store = store_.load(); store != nullptr) store->WakePulls();
  for (auto& [rank, d] : served) d->thread.join();
}

size_t ParameterServerService::doorbells_served() const {
  absl::MutexLock lock(&doorbells_mu_);
  size_t n = 0;
  for (const auto& [rank, d] : doorbells_) n += d->stop.load() ? 0 : 1;
  return n;
}

absl::StatusOr<std::shared_ptr<MappedLane>> ParameterServerService::LaneOf(
    const ShardStore& store, const grpc::CallbackServerContext& context,
    const v1::PushRequest& request) {
  // Only a worker of this job, on this machine, makes the shard open a file.
  if (absl::Status s = CheckJob(store, request.job_id()); !s.ok()) return s;
  if (absl::Status s = CheckRank(store, request.worker_rank()); !s.ok()) return s;
  if (grpc::Status member = CheckMemberSecret(
          member_key_, store.config().job_id(), MemberKind::kWorker, request.worker_rank(),
          request.incarnation(), CallerMemberSecret(context));
      !member.ok())
    return ToAbsl(member);
  if (!IsLoopbackPeer(context.peer()))
    return absl::UnimplementedError(absl::StrCat(
        "a shared-memory lane is for a worker on this machine; this push comes from ",
        QuoteUntrusted(context.peer()), ": send the values in the message"));
  absl::StatusOr<std::shared_ptr<MappedLane>> lane =
      lanes_.Get(request.worker_rank(), request.lane());
  if (!lane.ok())
    return absl::UnimplementedError(absl::StrCat(
        "cannot use the push's shared-memory lane (", lane.status().message(),
        "): send the values in the message"));
  return lane;
}

namespace {

// The table `name` of the job; NOT_FOUND otherwise.
absl::StatusOr<const v1::SparseTableSpec*> CheckTable(const ShardStore& store,
                                                      const std::string& name) {
  const v1::SparseTableSpec* table = FindSparseTable(store.config(), name);
  if (table != nullptr) return table;
  return absl::NotFoundError(absl::StrCat("the job has no sparse table '",
                                          QuoteUntrusted(name), "'"));
}

// Every id of a request to this shard: in the table's range (INVALID_ARGUMENT)
// and hashed to this shard (NOT_FOUND, as a chunk held by another shard).
// `distinct`: an id twice is INVALID_ARGUMENT (a push's rows are
// deduplicated on the worker, their gradients summed).
absl::Status CheckIds(const ShardStore& store, uint64_t generation,
                      const v1::SparseTableSpec& table,
                      const google::protobuf::RepeatedField<int64_t>& ids, bool distinct) {
  absl::flat_hash_set<int64_t> seen;
  if (distinct) seen.reserve(ids.size());
  const uint32_t shards = store.config().num_servers();
  for (int64_t id : ids) {
    if (!SparseIdInRange(table, id))
      return absl::InvalidArgumentError(absl::StrCat(
          "row id ", id, " is outside sparse table '", table.name(), "' (ids in [0, ",
          table.rows(), "))"));
    if (const uint32_t owner = SparseShardOf(id, shards); owner != store.shard())
      return NotHeld(store, generation,
                     absl::StrCat("row ", id, " of sparse table '", table.name(),
                                  "' is held by shard ", owner, ", not shard ", store.shard()));
    if (distinct && !seen.insert(id).second)
      return absl::InvalidArgumentError(absl::StrCat(
          "row id ", id, " appears twice in one push to sparse table '", table.name(),
          "' (deduplicate the ids and sum their gradients)"));
  }
  return absl::OkStatus();
}

// Validates a sparse push and turns it into a typed one; the values are
// converted to f32 into `scratch`, which must outlive the result.
absl::StatusOr<ShardStore::SparseGradientPush> DecodeSparsePush(
    const ShardStore& store, const v1::SparsePushRequest& request,
    std::vector<float>* scratch) {
  if (absl::Status s = CheckJob(store, request.job_id()); !s.ok()) return s;
  if (absl::Status s = CheckRank(store, request.worker_rank()); !s.ok()) return s;
  absl::StatusOr<const v1::SparseTableSpec*> table = CheckTable(store, request.table());
  if (!table.ok()) return table.status();
  const std::string what = absl::StrCat("sparse table '", (*table)->name(), "'");
  absl::StatusOr<DType> dtype = DTypeFromWire(request.dtype(), false, what);
  if (!dtype.ok()) return dtype.status();
  const uint64_t n = static_cast<uint64_t>(request.ids_size()) * (*table)->dim();
  if (request.gradients().size() != n * DTypeSize(*dtype))
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": expected ", n * DTypeSize(*dtype), " bytes of gradients (", request.ids_size(),
        " rows x ", (*table)->dim(), " x ", std::string(DTypeName(*dtype)), "), got ",
        request.gradients().size()));
  if (absl::Status s = CheckIds(store, request.generation(), **table, request.ids(), /*distinct=*/true); !s.ok())
    return s;
  if (scratch->size() < n) scratch->resize(n);
  ConvertElements(request.gradients().data(), *dtype, scratch->data(), DType::kF32, n);
  const absl::Span<const float> values = absl::MakeConstSpan(scratch->data(), n);
  if (int64_t bad = FirstOutOfRange(values); bad >= 0)
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": gradient element ", bad % (*table)->dim(), " of row ",
        request.ids(static_cast<int>(bad / (*table)->dim())), " is ", values[bad],
        " (NaN, infinity and magnitudes above ",
        ParameterServerService::kMaxGradientMagnitude, " are refused)"));
  ShardStore::SparseGradientPush push;
  push.worker_rank = request.worker_rank();
  push.incarnation = request.incarnation();
  push.step = request.step();
  push.generation = request.generation();
  push.table = (*table)->name();
  push.base_version = request.version();
  push.ids = absl::MakeConstSpan(request.ids().data(), request.ids_size());
  push.values = values;
  push.wire_bytes = request.gradients().size() + request.ids_size() * sizeof(int64_t);
  return push;
}

absl::StatusOr<ShardStore::SparsePullSpec> DecodeSparsePull(
    const ShardStore& store, const v1::SparsePullRequest& request, absl::Time deadline) {
  if (absl::Status s = CheckJob(store, request.job_id()); !s.ok()) return s;
  if (absl::Status s = CheckRank(store, request.worker_rank()); !s.ok()) return s;
  absl::StatusOr<const v1::SparseTableSpec*> table = CheckTable(store, request.table());
  if (!table.ok()) return table.status();
  absl::StatusOr<DType> dtype = DTypeFromWire(request.dtype(), true, "sparse pull");
  if (!dtype.ok()) return dtype.status();
  const uint64_t reply_bytes =
      static_cast<uint64_t>(request.ids_size()) * (*table)->dim() * DTypeSize(*dtype) + 64;
  if (reply_bytes > static_cast<uint64_t>(kMaxMessageBytes))
    return absl::ResourceExhaustedError(absl::StrCat(
        "sparse pull reply of ", reply_bytes, " bytes exceeds the ", kMaxMessageBytes,
        "-byte message limit; pull fewer rows per call"));
  if (absl::Status s = CheckIds(store, request.generation(), **table, request.ids(), /*distinct=*/false); !s.ok())
    return s;
  ShardStore::SparsePullSpec spec;
  spec.worker_rank = request.worker_rank();
  spec.table = (*table)->name();
  spec.ids.assign(request.ids().begin(), request.ids().end());
  if (request.has_clock()) spec.clock = request.clock();
  spec.generation = request.generation();
  spec.deadline = deadline;
  spec.dtype = *dtype;
  return spec;
}

// The chunks an optimizer-state request names: distinct, each of this
// shard (CheckChunk); their specs, in request order.
template <typename Ids>
absl::StatusOr<std::vector<const v1::ChunkSpec*>> CheckStateChunks(const ShardStore& store,
                                                                   uint64_t generation,
                                                                   const Ids& ids) {
  if (ids.empty()) return absl::InvalidArgumentError("an optimizer-state request names no chunk");
  std::vector<const v1::ChunkSpec*> specs;
  absl::flat_hash_set<uint32_t> seen;
  for (uint32_t id : ids) {
    absl::StatusOr<const v1::ChunkSpec*> spec = CheckChunk(store, id, generation);
    if (!spec.ok()) return spec.status();
    if (!seen.insert(id).second)
      return absl::InvalidArgumentError(absl::StrCat("chunk ", id, " twice in one request"));
    specs.push_back(*spec);
  }
  return specs;
}

// A loaded state's slot: num_elements f32, finite, and not negative where
// the optimizer takes its square root (Adam's second moment, AdaGrad's
// accumulator). Its magnitudes are bounded as gradients are
// (kMaxGradientMagnitude; a sum of squares by its square), so that no state
// makes an update overflow the weights.
absl::Status CheckStateSlot(const std::string& slot, const v1::ChunkSpec& spec, uint32_t index,
                            bool non_negative) {
  const std::string what = absl::StrCat("chunk ", spec.chunk_id(), "'s optimizer state slot ",
                                        index);
  if (slot.size() != spec.num_elements() * sizeof(float))
    return absl::InvalidArgumentError(absl::StrCat(what, " has ", slot.size(), " bytes, not ",
                                                   spec.num_elements(), " f32"));
  std::vector<float>& values = ScratchBuffer();
  values.resize(spec.num_elements());
  std::memcpy(values.data(), slot.data(), slot.size());
  const int64_t n = static_cast<int64_t>(values.size());
  if (int64_t bad = FirstNonFinite(values.data(), n); bad >= 0)
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": element ", bad, " is not a finite number"));
  const double most = non_negative ? double{ParameterServerService::kMaxGradientMagnitude} *
                                         ParameterServerService::kMaxGradientMagnitude
                                   : ParameterServerService::kMaxGradientMagnitude;
  for (int64_t i = 0; i < n; ++i) {
    if (non_negative && values[i] < 0)
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": element ", i, " is ", values[i], " (a sum of squares is not negative)"));
    if (std::fabs(values[i]) > most)
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": element ", i, " is ", values[i], ", above ", most));
  }
  return absl::OkStatus();
}

absl::Status CheckLoadOptimizerState(const ShardStore& store,
                                     const v1::LoadOptimizerStateRequest& request) {
  if (absl::Status s = CheckJob(store, request.job_id()); !s.ok()) return s;
  if (absl::Status s = CheckRank(store, request.worker_rank()); !s.ok()) return s;
  const v1::OptimizerKind kind = store.config().optimizer().kind();
  if (kind == v1::OPTIMIZER_WORKERS)
    return absl::FailedPreconditionError(
        "the job's optimizer runs on the workers: its servers keep no optimizer state");
  if (request.kind() != kind)
    return absl::InvalidArgumentError(absl::StrCat(
        "the state is the ", OptimizerName(request.kind()), " optimizer's; the job's servers keep ",
        OptimizerName(kind), "'s"));
  std::vector<uint32_t> ids;
  for (const v1::ChunkOptimizerState& c : request.chunks()) ids.push_back(c.chunk_id());
  absl::StatusOr<std::vector<const v1::ChunkSpec*>> specs =
      CheckStateChunks(store, request.generation(), ids);
  if (!specs.ok()) return specs.status();
  const uint32_t slots = OptimizerStateSlots(kind);
  for (int i = 0; i < request.chunks_size(); ++i) {
    const v1::ChunkOptimizerState& c = request.chunks(i);
    if (c.steps() > static_cast<uint64_t>(kMaxOptimizerSteps))
      return absl::InvalidArgumentError(absl::StrCat("chunk ", c.chunk_id(), ": ", c.steps(),
                                                     " steps, above ", kMaxOptimizerSteps));
    if (static_cast<uint32_t>(c.slots_size()) != slots)
      return absl::InvalidArgumentError(absl::StrCat("chunk ", c.chunk_id(), ": ", c.slots_size(),
                                                     " optimizer state slots; ",
                                                     OptimizerName(kind), " has ", slots));
    for (uint32_t k = 0; k < slots; ++k) {
      const bool square_root = (kind == v1::OPTIMIZER_ADAM && k == 1) ||
                               (kind == v1::OPTIMIZER_ADAGRAD && k == 0);
      if (absl::Status s = CheckStateSlot(c.slots(static_cast<int>(k)), *(*specs)[i], k,
                                          square_root);
          !s.ok())
        return s;
    }
  }
  return absl::OkStatus();
}

}  // namespace

grpc::Status ParameterServerService::GetOptimizerState(
    grpc::ServerContext* context, const v1::GetOptimizerStateRequest* request,
    v1::GetOptimizerStateResponse* response) {
  ShardStore* store = store_.load();
  if (store == nullptr) return ToGrpc(NotReady());
  if (absl::Status s = CheckJob(*store, request->job_id()); !s.ok()) return ToGrpc(s);
  if (absl::Status s = CheckRank(*store, request->worker_rank()); !s.ok()) return ToGrpc(s);
  absl::StatusOr<std::vector<const v1::ChunkSpec*>> specs =
      CheckStateChunks(*store, request->generation(), request->chunk_ids());
  if (!specs.ok()) return ToGrpc(specs.status());
  uint64_t bytes = 0;
  const uint32_t slots = OptimizerStateSlots(store->config().optimizer().kind());
  for (const v1::ChunkSpec* spec : *specs) bytes += spec->num_elements() * sizeof(float) * slots;
  if (bytes + 64 * specs->size() > static_cast<uint64_t>(kMaxMessageBytes))
    return ToGrpc(absl::ResourceExhaustedError(absl::StrCat(
        "the optimizer state of ", specs->size(), " chunks is ", bytes, " bytes, above the ",
        kMaxMessageBytes, "-byte message limit; ask for fewer chunks per call")));
  absl::StatusOr<v1::GetOptimizerStateResponse> state =
      store->ReadOptimizerState(request->generation(), request->chunk_ids());
  if (!state.ok()) return ToGrpc(state.status());
  *response = std::move(*state);
  return grpc::Status::OK;
}

grpc::Status ParameterServerService::LoadOptimizerState(
    grpc::ServerContext* context, const v1::LoadOptimizerStateRequest* request,
    v1::LoadOptimizerStateResponse* response) {
  ShardStore* store = store_.load();
  if (store == nullptr) return ToGrpc(NotReady());
  if (absl::Status s = CheckLoadOptimizerState(*store, *request); !s.ok()) return ToGrpc(s);
  // As a push: only the rank's registered incarnation may change the state.
  if (grpc::Status member = CheckMemberSecret(
          member_key_, store->config().job_id(), MemberKind::kWorker, request->worker_rank(),
          request->incarnation(), CallerMemberSecret(*context));
      !member.ok())
    return member;
  if (absl::Status s = store->LoadOptimizerState(*request); !s.ok()) return ToGrpc(s);
  spdlog::info("rank {} loaded the optimizer's state of {} chunks (a program's saved {})",
               request->worker_rank(), request->chunks_size(),
               OptimizerName(request->kind()));
  return grpc::Status::OK;
}

grpc::Status ParameterServerService::PushSparse(
    grpc::ServerContext* context, const v1::SparsePushRequest* request,
    v1::SparsePushResponse* response) {
  ShardStore* store = store_.load();
  if (store == nullptr) return ToGrpc(NotReady());
  absl::StatusOr<ShardStore::SparseGradientPush> push =
      DecodeSparsePush(*store, *request, &ScratchBuffer());
  if (!push.ok()) {
    store->CountRejectedAtEdge(1);
    return ToGrpc(push.status());
  }
  // As Push: only the rank's registered incarnation may push as it.
  if (grpc::Status member = CheckMemberSecret(
          member_key_, store->config().job_id(), MemberKind::kWorker,
          request->worker_rank(), request->incarnation(), CallerMemberSecret(*context));
      !member.ok()) {
    store->CountRejectedAtEdge(1);
    return member;
  }
  absl::StatusOr<ShardStore::SparsePushResult> result = store->PushSparse(*push);
  if (!result.ok()) return ToGrpc(result.status());
  response->set_version(result->version);
  response->set_duplicate(result->duplicate);
  response->set_late(result->late);
  response->set_too_stale(result->too_stale);
  return grpc::Status::OK;
}

grpc::ServerUnaryReactor* ParameterServerService::PullSparse(
    grpc::CallbackServerContext* context, const v1::SparsePullRequest* request,
    v1::SparsePullResponse* response) {
  // The call may wait: its reactor hears a cancellation.
  ShardStore* store = store_.load();
  auto* reactor = new PullReactor(store);
  if (store == nullptr) {
    reactor->Finish(ToGrpc(NotReady()));
    return reactor;
  }
  absl::StatusOr<ShardStore::SparsePullSpec> spec =
      DecodeSparsePull(*store, *request, PullDeadline(CallDeadline(*context), request->timeout_ms()));
  if (!spec.ok()) {
    reactor->Finish(ToGrpc(spec.status()));
    return reactor;
  }
  const v1::DType wire = DTypeToWire(spec->dtype);
  spec->cancelled = reactor->cancelled();
  store->PullSparseAsync(std::move(*spec),
                         [reactor, response, wire](absl::StatusOr<ShardStore::PulledRows> rows) {
                           if (!rows.ok()) {
                             reactor->Finish(ToGrpc(rows.status()));
                             return;
                           }
                           response->set_values(std::move(rows->data));
                           response->set_dtype(wire);
                           response->set_version(rows->version);
                           reactor->Finish(grpc::Status::OK);
                         });
  return reactor;
}

grpc::Status ParameterServerService::GetShardStatus(
    grpc::ServerContext* context, const v1::GetShardStatusRequest* request,
    v1::ShardStatus* response) {
  ShardStore* store = store_.load();
  if (store == nullptr) return ToGrpc(NotReady());
  if (absl::Status s = CheckJob(*store, request->job_id()); !s.ok())
    return ToGrpc(s);
  *response = ShardStatus(*store);
  return grpc::Status::OK;
}

v1::ShardStatus ParameterServerService::ShardStatus(const ShardStore& store) const {
  v1::ShardStatus status = store.ShardStatus();
  status.set_doorbells(static_cast<uint32_t>(doorbells_served()));
  status.set_doorbell_pushes(doorbell_pushes_.load());
  return status;
}

}  // namespace grps
