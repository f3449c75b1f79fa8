// PushLanes: the shared-memory lane a worker's dense pushes travel through
// to shards on its machine (wire/shared_lane.h), with a doorbell for each
// shard (wire/lane_doorbell.h); which shards refused it; and when a lane is
// retired for a fresh one.
//
//   PushLanes lanes(config, layout);
//   std::shared_ptr<PushLane> lane = lanes.Take(part, shard);  // null: bytes
//   if (lane) { *header.mutable_lane() = lane->RefFor(shard, part, pull);
//               /* write the values at lane->place[part] */ }
//   ... the call ends with `status`:
//   lanes.CallEnded(lane, part, shard, status, reply.doorbell());
//
// A dense push's gradients, and its fused pull's weights, travel in the
// part's place of the lane; the gRPC call (or the doorbell's ring) carries
// the rest. A shard that cannot use the lane refuses the push unchanged
// (UNIMPLEMENTED), and from then on that shard gets bytes. A lane call that
// fails where the shard may have accepted it (deadline, cancellation, a
// lost connection) retires the lane (a late write of the weights goes to
// the old one): later calls take a fresh one.
//
// Doorbells: once a shard's reply says it serves its doorbell in the lane,
// the next pushes to it are rung there instead of called (the same request
// bytes, the same reply), and the waiting thread sleeps on the answer's
// futex word (PushLane::AwaitAnswer).
#ifndef GRPS_WORKER_PUSH_LANES_H_
#define GRPS_WORKER_PUSH_LANES_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/support/byte_buffer.h"
#include "proto/grps.pb.h"
#include "wire/lane_doorbell.h"
#include "wire/shared_lane.h"
#include "worker/chunk_layout.h"

namespace grps {

// A LaneSegment with a place of `bytes[i]` bytes at `place[i]` for each
// part i of a ChunkLayout, and whether a call holds it (`busy[i]`). A
// push's gradients and its fused pull's weights share the place: the shard
// copies the gradients out before it accepts the push, and writes the
// weights after. After the places, a doorbell area for each shard with a
// slot for each of its parts (`slot[i]`), and whether the shard serves it
// (`open[shard]`, set when a reply says so).
struct PushLane {
  std::shared_ptr<LaneSegment> segment;
  std::vector<uint64_t> place, bytes;         // by part
  std::unique_ptr<std::atomic<bool>[]> busy;  // by part
  std::vector<uint64_t> doorbell_offset;      // by shard
  uint32_t slot_bytes = 0;
  std::vector<LaneDoorbell> doorbell;         // by shard
  std::vector<uint32_t> slot;                 // by part
  std::unique_ptr<std::atomic<bool>[]> open;  // by shard

  // What a push of part `index` to `shard` carries to name the lane and its
  // doorbell; with `pull`, the weights come back into the part's place.
  v1::SharedLane RefFor(size_t shard, size_t index, bool pull) const;
  // Whether a push of `request_bytes` to `shard` may be rung at its
  // doorbell instead of called: the shard serves it and the request fits.
  bool CanRing(size_t shard, size_t request_bytes) const;
  // Places push `request` of part `index` in its slot of `shard`'s doorbell
  // and rings; the sequence its answer will carry.
  uint32_t Ring(size_t shard, size_t index, const grpc::ByteBuffer& request);
  // Waits for the answer to `seq`, rung for part `index` at `shard`'s
  // doorbell at `rung_at`, and puts its reply in `reply`: the shard's
  // status, or DEADLINE_EXCEEDED with no answer `timeout` after `rung_at`,
  // or UNAVAILABLE once the shard stops beating for kDoorbellSilence (it
  // is gone, or stopped serving the doorbell).
  absl::Status AwaitAnswer(size_t shard, size_t index, uint32_t seq, absl::Time rung_at,
                           absl::Duration timeout, grpc::ByteBuffer* reply) const;
  // The `bytes` bytes at `offset` when they lie within part `index`'s
  // place (where a reply may name its values); null otherwise.
  const char* Within(size_t index, uint64_t offset, uint64_t bytes) const;
};

// Thread safety: every method may be called from any thread.
class PushLanes {
 public:
  // `layout` must outlive this. There is no lane (every push in bytes)
  // unless `config` asks for shared memory (JobConfig.local_transport) and
  // sends dense gradients (top-k ones travel in bytes), and one can be made.
  PushLanes(const v1::JobConfig& config, const ChunkLayout& layout);
  PushLanes(const PushLanes&) = delete;
  PushLanes& operator=(const PushLanes&) = delete;

  // The current lane with part `index`'s place taken for a push to
  // `shard`; null where that push goes in bytes: no lane, `shard` refused
  // it, or a call still holds the place.
  std::shared_ptr<PushLane> Take(size_t index, size_t shard) ABSL_LOCKS_EXCLUDED(mu_);
  // The push that took `lane`'s place of part `index` (Take) to `shard`
  // ended with `status`; `doorbell`: its reply says the shard serves the
  // lane's doorbell. A status that may hide an accepted push retires the
  // lane and keeps the place taken; UNIMPLEMENTED marks `shard` as refusing
  // lanes; otherwise the place is free again.
  void CallEnded(const std::shared_ptr<PushLane>& lane, size_t index, size_t shard,
                 const absl::Status& status, bool doorbell) ABSL_LOCKS_EXCLUDED(mu_);
  // Whether pushes to `shard` may still use a lane (there is one, and the
  // shard has not refused it).
  bool Usable(size_t shard) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // A fresh lane with a place for every part; null where none can be made.
  std::shared_ptr<PushLane> Make() const;

  const ChunkLayout& layout_;
  const bool wanted_;          // the job asks for lanes and sends dense gradients
  const size_t job_id_bytes_;  // a doorbell slot holds the request's job id

  mutable absl::Mutex mu_;
  std::shared_ptr<PushLane> lane_ ABSL_GUARDED_BY(mu_);  // null: bytes only
  std::vector<bool> refused_ ABSL_GUARDED_BY(mu_);       // by shard
};

}  // namespace grps

#endif  // GRPS_WORKER_PUSH_LANES_H_
