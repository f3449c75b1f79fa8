#include "server/request_checks.h"

#include <cmath>
#include <cstring>
#include <optional>
#include <utility>
#include <vector>

#include "daemon/daemon.h"
#include "job/job_config.h"
#include "job/sparse_tables.h"
#include "server/chunk_optimizer.h"
#include "wire/buffer_pool.h"

namespace grps {
namespace {

// The bits of kMaxGradientMagnitude: a float is NaN, infinite or larger in
// magnitude when the bits of its |v| are above them (NaN and infinity have
// the largest), a test with no branch, so loops of it vectorize.
uint32_t GradientLimitBits() {
  uint32_t bits;
  const float max = kMaxGradientMagnitude;
  std::memcpy(&bits, &max, sizeof(bits));
  return bits;
}
bool OutOfRangeBits(uint32_t bits, uint32_t limit) { return (bits & 0x7fffffffu) > limit; }

}  // namespace

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

absl::Status NotHeld(const ShardStore& store, uint64_t generation, std::string what) {
  if (absl::Status s = store.CheckGeneration(generation); !s.ok()) return s;
  return absl::NotFoundError(std::move(what));
}

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

std::vector<float>& ScratchBuffer() {
  thread_local std::vector<float> scratch;
  return scratch;
}

namespace {

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
      " (NaN, infinity and magnitudes above ", kMaxGradientMagnitude,
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
  }
  if (!distinct) return absl::OkStatus();
  if (const std::optional<int64_t> id = FirstRepeat(absl::MakeConstSpan(ids.data(), ids.size()));
      id.has_value())
    return absl::InvalidArgumentError(
        absl::StrCat("row id ", *id, " appears twice in one push to sparse table '", table.name(),
                     "' (deduplicate the ids and sum their gradients)"));
  return absl::OkStatus();
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
  const double most = non_negative ? double{kMaxGradientMagnitude} *
                                         kMaxGradientMagnitude
                                   : kMaxGradientMagnitude;
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

}  // namespace

// A push's ids are distinct but for a faulty or hostile client, so a bitmap
// of hashed ids (2^20 bits, this thread's, cleared by walking the ids
// again) passes most ids on one cached bit each; only the ids whose bit was
// already set (a few percent of 65,536 ids) are checked exactly, in a set
// of their own. A hash set of every id cost about three times as much
// (65,536 ids, a shard's half of a 131,072-row push: 2.7 ms against 0.85
// here). Ids chosen to collide in the bitmap cost what that set of every id
// costs, no more.
std::optional<int64_t> FirstRepeat(absl::Span<const int64_t> ids) {
  constexpr int kBits = 20;
  thread_local std::vector<uint64_t> bitmap((size_t{1} << kBits) / 64, 0);
  const auto bit = [](int64_t id) {
    return static_cast<uint32_t>((static_cast<uint64_t>(id) * 0x9E3779B97F4A7C15ull) >>
                                 (64 - kBits));
  };
  absl::flat_hash_set<int64_t> candidates;
  for (int64_t id : ids) {
    const uint32_t b = bit(id);
    uint64_t& word = bitmap[b / 64];
    const uint64_t mask = uint64_t{1} << (b % 64);
    if ((word & mask) != 0) candidates.insert(id);
    word |= mask;
  }
  for (int64_t id : ids) bitmap[bit(id) / 64] = 0;
  if (candidates.empty()) return std::nullopt;
  absl::flat_hash_set<int64_t> seen;
  for (int64_t id : ids)
    if (candidates.contains(id) && !seen.insert(id).second) return id;
  return std::nullopt;
}

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
  // The caller's error, never a busy shard's: INVALID_ARGUMENT, which no
  // client retries (a RESOURCE_EXHAUSTED pull is waited out).
  if (reply_bytes > static_cast<uint64_t>(kMaxMessageBytes))
    return absl::InvalidArgumentError(
        absl::StrCat("pull reply of ", reply_bytes, " bytes exceeds the ", kMaxMessageBytes,
                     "-byte message limit; pull fewer chunks per call"));
  spec.min_version = request.min_version();
  if (request.has_clock()) spec.clock = request.clock();
  spec.generation = request.generation();
  spec.deadline = deadline;
  spec.dtype = *dtype;
  return spec;
}

absl::StatusOr<ShardStore::SparseGradientPush> DecodeSparsePush(
    const ShardStore& store, const v1::SparsePushRequest& request, SliceReader gradients,
    std::vector<float>* scratch) {
  if (absl::Status s = CheckJob(store, request.job_id()); !s.ok()) return s;
  if (absl::Status s = CheckRank(store, request.worker_rank()); !s.ok()) return s;
  absl::StatusOr<const v1::SparseTableSpec*> table = CheckTable(store, request.table());
  if (!table.ok()) return table.status();
  const std::string what = absl::StrCat("sparse table '", (*table)->name(), "'");
  absl::StatusOr<DType> dtype = DTypeFromWire(request.dtype(), false, what);
  if (!dtype.ok()) return dtype.status();
  const uint64_t n = static_cast<uint64_t>(request.ids_size()) * (*table)->dim();
  const uint64_t gradient_bytes = gradients.left();
  if (gradient_bytes != n * DTypeSize(*dtype))
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": expected ", n * DTypeSize(*dtype), " bytes of gradients (",
                     request.ids_size(), " rows x ", (*table)->dim(), " x ",
                     std::string(DTypeName(*dtype)), "), got ", gradient_bytes));
  if (absl::Status s = CheckIds(store, request.generation(), **table, request.ids(), /*distinct=*/true); !s.ok())
    return s;
  if (scratch->size() < n) scratch->resize(n);
  const absl::Span<const float> values = absl::MakeConstSpan(scratch->data(), n);
  // The one copy out of gRPC's slices (f32), or the conversion from them.
  thread_local std::string converting;
  if (absl::Status s = ReadValues(gradients, *dtype, scratch->data(), n, &converting); !s.ok())
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", s.message()));
  if (const int64_t bad = FirstOutOfRange(values); bad >= 0)
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": gradient element ", bad % (*table)->dim(), " of row ",
        request.ids(static_cast<int>(bad / (*table)->dim())), " is ", values[bad],
        " (NaN, infinity and magnitudes above ",
        kMaxGradientMagnitude, " are refused)"));
  ShardStore::SparseGradientPush push;
  push.worker_rank = request.worker_rank();
  push.incarnation = request.incarnation();
  push.step = request.step();
  push.generation = request.generation();
  push.table = (*table)->name();
  push.base_version = request.version();
  push.ids = absl::MakeConstSpan(request.ids().data(), request.ids_size());
  push.values = values;
  push.wire_bytes = gradient_bytes + request.ids_size() * sizeof(int64_t);
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
  if (reply_bytes > static_cast<uint64_t>(kMaxMessageBytes))  // as DecodePull's
    return absl::InvalidArgumentError(
        absl::StrCat("sparse pull reply of ", reply_bytes, " bytes exceeds the ", kMaxMessageBytes,
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
  // The rows are read into room a reply before this one gave back (the
  // service sends them with BufferPool::Default() as their recycle): no
  // fresh pages to fault in and zero every call.
  spec.reply = BufferPool::Default().TakeRoom(reply_bytes - 64);
  return spec;
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

}  // namespace grps
