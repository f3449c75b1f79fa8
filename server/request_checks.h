// The edge's admission of every request to a shard: what a request alone
// tells, checked against the shard's job, map and config before anything
// changes: its job and rank, each chunk or row (this shard's, once, in its
// table), sizes and dtypes, and every gradient value finite and in range
// (kMaxGradientMagnitude). Each refusal is a status naming what is wrong.
// What only the store knows (the rank's live incarnation, the values given
// for a chunk, the generation, duplicates, the mode's rules) it checks
// itself, in one pass (ShardStore::Admit; its order in shard_store.h):
// together the two places a push is admitted (docs/architecture.md). The
// edge reads the store's generation only in NotHeld, to say why a chunk or
// row is not here; it admits nothing by it.
#ifndef GRPS_SERVER_REQUEST_CHECKS_H_
#define GRPS_SERVER_REQUEST_CHECKS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "proto/grps.pb.h"
#include "server/shard_store.h"
#include "tensor/dtype.h"
#include "wire/chunk_codec.h"
#include "wire/shared_lane.h"

namespace grps {

// Gradient elements beyond this magnitude are refused (INVALID_ARGUMENT):
// finite inputs whose sum over the workers, or whose product with the
// learning rate, overflows would make the weights non-finite. No real
// gradient comes near it; it leaves room for 10^23 of them in one sum.
inline constexpr float kMaxGradientMagnitude = 1e15f;

// FAILED_PRECONDITION unless `job_id` is the shard's job.
absl::Status CheckJob(const ShardStore& store, const std::string& job_id);
// INVALID_ARGUMENT unless `rank` is one of the job's ranks.
absl::Status CheckRank(const ShardStore& store, uint32_t rank);
// A chunk or row this shard does not hold: NOT_FOUND, unless the request
// is of another generation than the shard's, whose map may place it
// otherwise (a re-sharded job): a worker that heard of the new map before
// the shard rebuilt is told to retry (UNAVAILABLE), and a request of the
// map the job rolled back from is refused as of an older generation
// (ABORTED), as the store would.
absl::Status NotHeld(const ShardStore& store, uint64_t generation, std::string what);
// The spec of a chunk this shard holds; NOT_FOUND otherwise (NotHeld).
absl::StatusOr<const v1::ChunkSpec*> CheckChunk(const ShardStore& store, uint32_t chunk_id,
                                                uint64_t generation);
// Index of the first element of `values` that is NaN, infinite or above
// kMaxGradientMagnitude in magnitude, or -1.
int64_t FirstOutOfRange(absl::Span<const float> values);
// The first id of `ids`, in order, that an earlier one equals; none when
// they are all distinct (a sparse push's ids must be).
std::optional<int64_t> FirstRepeat(absl::Span<const int64_t> ids);

// Gradients converted to f32 live here between validation and the store.
// One per gRPC thread, grown and reused, so a steady stream of pushes
// allocates nothing.
std::vector<float>& ScratchBuffer();

// A dense push past the edge's checks, with its pull half's dtype and, for
// a push whose reply goes into its lane, the places there.
struct CheckedPush {
  ShardStore::GradientPush push;
  DType pull_dtype = DType::kF32;
  std::vector<uint64_t> reply_offsets;
  std::vector<char*> reply_into;
};
// A whole push, checked and turned into a typed one: job, rank, at least one
// chunk and one sample, the program's optimizers, each chunk (this shard's,
// once, its dtype, its indices, as many bytes as its values need, in the
// message or in `lane`, which may be null), every value in range; then the
// pull half's dtype and its places in the lane. The gradients are copied,
// as f32, into the thread's ScratchBuffer, which the result points into.
absl::StatusOr<CheckedPush> CheckPush(const ShardStore& store, const v1::PushRequest& request,
                                      std::vector<ReceivedChunk>& chunks,
                                      const MappedLane* lane);

// The checks of a pull that need no waiting (job, rank, dtype, each chunk
// this shard's and once, the reply within the message limit); the typed
// spec, waiting until `deadline`.
absl::StatusOr<ShardStore::PullSpec> DecodePull(const ShardStore& store,
                                                const v1::PullRequest& request,
                                                absl::Time deadline);

// A sparse push checked (job, rank, table, dtype, size, every id in the
// table, this shard's and once, every value in range) and turned into a
// typed one. `request` holds everything but the gradients, whose bytes
// `gradients` reads (DecodeSparsePushRequest); they are copied, as f32, into
// `scratch`, which must outlive the result, as must `request` (the ids).
absl::StatusOr<ShardStore::SparseGradientPush> DecodeSparsePush(
    const ShardStore& store, const v1::SparsePushRequest& request, SliceReader gradients,
    std::vector<float>* scratch);
// A sparse pull checked as a push is (an id may come twice) and its reply
// within the message limit; the spec's reply room from BufferPool::Default().
absl::StatusOr<ShardStore::SparsePullSpec> DecodeSparsePull(
    const ShardStore& store, const v1::SparsePullRequest& request, absl::Time deadline);

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

// A LoadOptimizerState request: the job's, for its servers' optimizer, each
// chunk this shard's and once, its step count bounded, and each slot as
// many finite f32 as the chunk has, in range (non-negative where the
// optimizer takes its square root).
absl::Status CheckLoadOptimizerState(const ShardStore& store,
                                     const v1::LoadOptimizerStateRequest& request);

}  // namespace grps

#endif  // GRPS_SERVER_REQUEST_CHECKS_H_
