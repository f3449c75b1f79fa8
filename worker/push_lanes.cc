// PushLanes and PushLane: a worker's shared-memory lane for its pushes, its
// places and doorbells, and the lane's retirement and refusal.
#include "worker/push_lanes.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace grps {
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

v1::SharedLane PushLane::RefFor(size_t shard, size_t index, bool pull) const {
  v1::SharedLane ref = segment->Ref();
  ref.set_doorbell_offset(doorbell_offset[shard]);
  ref.set_doorbell_slots(doorbell[shard].slots());
  ref.set_doorbell_slot_bytes(slot_bytes);
  if (pull) ref.set_reply_offset(place[index]);
  return ref;
}

bool PushLane::CanRing(size_t shard, size_t request_bytes) const {
  return open[shard].load() && request_bytes <= doorbell[shard].capacity();
}

uint32_t PushLane::Ring(size_t shard, size_t index, const grpc::ByteBuffer& request) {
  return doorbell[shard].Ring(slot[index], request);
}

absl::Status PushLane::AwaitAnswer(size_t shard, size_t index, uint32_t seq, absl::Time rung_at,
                                   absl::Duration timeout, grpc::ByteBuffer* reply) const {
  const LaneDoorbell& bell = doorbell[shard];
  // A call's deadline, as the gRPC call's; a shard that stops beating is
  // gone (or stopped serving the doorbell) long before it.
  const absl::Time deadline = rung_at + timeout;
  uint32_t beat = bell.beat();
  absl::Time beat_at = absl::Now();
  while (true) {
    const absl::Time now = absl::Now();
    if (bell.AwaitAnswer(slot[index], seq, std::min(deadline - now, kDoorbellBeat)))
      return bell.TakeAnswer(slot[index], reply);
    const absl::Time later = absl::Now();
    if (later >= deadline)
      return absl::DeadlineExceededError(absl::StrCat(
          "no answer at the shard's doorbell in ", absl::FormatDuration(timeout)));
    if (const uint32_t b = bell.beat(); b != beat) {
      beat = b;
      beat_at = later;
    } else if (later - beat_at >= kDoorbellSilence) {
      return absl::UnavailableError(absl::StrCat(
          "the shard stopped serving this worker's doorbell (no beat for ",
          absl::FormatDuration(later - beat_at), ")"));
    }
  }
}

const char* PushLane::Within(size_t index, uint64_t offset, uint64_t size) const {
  if (!LaneSpanWithin(offset, size, place[index], place[index] + bytes[index])) return nullptr;
  return segment->base() + offset;
}

PushLanes::PushLanes(const v1::JobConfig& config, const ChunkLayout& layout)
    : layout_(layout),
      wanted_(config.local_transport() == v1::LOCAL_TRANSPORT_SHARED_MEMORY &&
              !(config.gradient_topk() > 0 && config.gradient_topk() < 1)),
      job_id_bytes_(config.job_id().size()) {
  absl::MutexLock lock(&mu_);
  lane_ = Make();
  refused_.assign(layout_.num_shards(), false);
}

std::shared_ptr<PushLane> PushLanes::Make() const {
  if (!wanted_) return nullptr;  // sparse (top-k) gradients travel in bytes
  auto lane = std::make_shared<PushLane>();
  const std::vector<ChunkLayout::Part>& parts = layout_.parts();
  uint64_t at = kLaneHeaderBytes;
  size_t most_chunks = 0;
  const size_t shards = layout_.num_shards();
  // Each shard's slots: one per part to it (at least one, as an area needs).
  std::vector<uint32_t> slots(shards, 0);
  for (size_t p = 0; p < parts.size(); ++p) {
    const ChunkLayout::Part& part = parts[p];
    const uint64_t bytes = (uint64_t{layout_.part_bytes(p)} + 63) / 64 * 64;
    lane->bytes.push_back(bytes);
    lane->place.push_back(at);
    at += bytes;
    most_chunks = std::max(most_chunks, part.chunk_ids.size());
    lane->slot.push_back(slots[part.shard]++);
  }
  // A slot holds a PushRequest without values, or its PushResponse: the
  // job id, the lane, and a few varints per chunk.
  const uint64_t capacity = 1024 + job_id_bytes_ + 64 * uint64_t{most_chunks};
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
  lane->busy = std::make_unique<std::atomic<bool>[]>(parts.size());
  for (size_t i = 0; i < parts.size(); ++i) lane->busy[i].store(false);
  lane->open = std::make_unique<std::atomic<bool>[]>(shards);
  for (size_t shard = 0; shard < shards; ++shard) {
    lane->open[shard].store(false);
    lane->doorbell.emplace_back(lane->segment->base() + lane->doorbell_offset[shard],
                                slots[shard], lane->slot_bytes);
  }
  return lane;
}

std::shared_ptr<PushLane> PushLanes::Take(size_t index, size_t shard) {
  absl::MutexLock lock(&mu_);
  if (lane_ != nullptr && !refused_[shard] && !lane_->busy[index].exchange(true)) return lane_;
  return nullptr;
}

void PushLanes::CallEnded(const std::shared_ptr<PushLane>& lane, size_t index, size_t shard,
                          const absl::Status& status, bool doorbell) {
  // The shard serves the lane's doorbell: its later pushes are rung.
  if (status.ok() && doorbell) lane->open[shard].store(true);
  if (MayWriteLate(status)) {
    // Never use this place again: a fresh lane for this and later calls.
    absl::MutexLock lock(&mu_);
    if (lane_ == lane) lane_ = Make();
    return;
  }
  if (absl::IsUnimplemented(status)) {
    // The shard cannot use the lane (and changed nothing): bytes from now on.
    absl::MutexLock lock(&mu_);
    if (!refused_[shard])
      spdlog::info("shard {} cannot use this worker's shared-memory lane; its values go "
                   "through gRPC ({})", shard, std::string(status.message()));
    refused_[shard] = true;
  }
  lane->busy[index].store(false);
}

bool PushLanes::Usable(size_t shard) const {
  absl::MutexLock lock(&mu_);
  return lane_ != nullptr && shard < refused_.size() && !refused_[shard];
}

}  // namespace grps
