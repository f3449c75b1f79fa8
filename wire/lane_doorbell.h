// Lane doorbells: how a worker's steady-state pushes reach a shard on the
// same machine without a gRPC call (docs/performance.md, "Doorbells").
//
// A lane (wire/shared_lane.h) moves a push's values through memory both
// processes map, but each push was still a gRPC call: a request and a reply
// of a few hundred bytes, and the threads of two gRPC stacks woken for
// them. A doorbell is a place in the lane where the same request and reply
// travel instead: the worker writes the PushRequest it would have sent into
// a slot and rings (a futex word the shard's serving thread sleeps on); the
// shard answers in the slot with the call's status and PushResponse and
// wakes the worker (a futex word the worker sleeps on). Everything a push
// means (the job, rank, incarnation, step, generation, exactly-once, the
// mode's waiting) is in those bytes and checked as a call's would be.
//
// A doorbell area, at some offset of a lane:
//
//   head (64 bytes)   u32 ring: the worker adds 1 after each request it places
//                     u32 beat: the shard adds 1 at least every kDoorbellBeat
//                               while it serves the area
//   slot 0 .. slots-1, slot_bytes each:
//     head (64 bytes) u32 request: the sequence of the request in the slot
//                     u32 answer:  the sequence of the request answered
//                     u32 request bytes, u32 status code, u32 reply bytes
//     request bytes   capacity() of them
//     reply bytes     capacity() of them: the PushResponse, or the message
//                     of a status other than OK
//
// A slot holds one request at a time: the worker places the next one only
// after the answer to the one before (or after it gave up on the lane).
// Neither side trusts the other's bytes: lengths are checked, and each side
// copies what it reads out of the slot before it parses it. The words are
// read and written with acquire/release atomics: what a side wrote before it
// advanced a word is what the other side reads after it saw the word move.
#ifndef GRPS_WIRE_LANE_DOORBELL_H_
#define GRPS_WIRE_LANE_DOORBELL_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "grpcpp/support/byte_buffer.h"

namespace grps {

// The shard beats a doorbell it serves at least this often (from a thread
// of its own, however long a push takes); a worker that sees
// no beat for kDoorbellSilence takes the shard for gone.
inline constexpr absl::Duration kDoorbellBeat = absl::Milliseconds(100);
inline constexpr absl::Duration kDoorbellSilence = absl::Seconds(1);

// Bounds of the geometry a shard accepts.
inline constexpr uint32_t kDoorbellHeadBytes = 64;
inline constexpr uint32_t kMinDoorbellSlotBytes = 256;
inline constexpr uint32_t kMaxDoorbellSlotBytes = 1 << 20;
inline constexpr uint32_t kMaxDoorbellSlots = 1024;

class LaneDoorbell {
 public:
  // INVALID_ARGUMENT unless 1 <= slots <= kMaxDoorbellSlots and
  // slot_bytes is a multiple of 64 in [kMinDoorbellSlotBytes,
  // kMaxDoorbellSlotBytes].
  static absl::Status CheckGeometry(uint32_t slots, uint32_t slot_bytes);
  // Bytes of an area of that geometry.
  static uint64_t AreaBytes(uint32_t slots, uint32_t slot_bytes) {
    return kDoorbellHeadBytes + uint64_t{slots} * slot_bytes;
  }
  // The slot size that holds requests and replies of `capacity` bytes.
  static uint32_t SlotBytesFor(uint32_t capacity);

  // The area at `base` (AreaBytes of it, 64-byte aligned, in a mapping that
  // outlives this view), of a geometry CheckGeometry accepts.
  LaneDoorbell(char* base, uint32_t slots, uint32_t slot_bytes)
      : base_(base), slots_(slots), slot_bytes_(slot_bytes) {}

  uint32_t slots() const { return slots_; }
  // The most bytes a request or a reply may have.
  uint32_t capacity() const { return (slot_bytes_ - kDoorbellHeadBytes) / 2; }

  // ---- The worker's side ----

  // Places `request` (at most capacity() bytes) in `slot` and rings; the
  // sequence its answer will carry.
  uint32_t Ring(uint32_t slot, const grpc::ByteBuffer& request);
  // Waits at most `timeout` for the answer to `seq` in `slot`; whether it
  // is there.
  bool AwaitAnswer(uint32_t slot, uint32_t seq, absl::Duration timeout) const;
  // The answer in `slot`: the status the shard answered with and, for OK,
  // its reply (copied out of the lane) in `reply`. DATA_LOSS for an answer
  // that does not fit its slot or carries no valid status code.
  absl::Status TakeAnswer(uint32_t slot, grpc::ByteBuffer* reply) const;
  uint32_t beat() const;

  // ---- The shard's side ----

  uint32_t rings() const;
  // Waits at most `timeout` while rings() == `seen` (returns early on a
  // ring or a Wake).
  void AwaitRing(uint32_t seen, absl::Duration timeout) const;
  // Wakes a thread in AwaitRing without ringing (to stop it).
  void Wake() const;
  // The sequence of the request in `slot`, and of its answer.
  uint32_t request_seq(uint32_t slot) const;
  uint32_t answer_seq(uint32_t slot) const;
  // The request in `slot`, copied out of the lane; INVALID_ARGUMENT when
  // its length is not within capacity().
  absl::Status TakeRequest(uint32_t slot, grpc::ByteBuffer* request) const;
  // Answers request `seq` of `slot` with `status` and, for OK, `reply`;
  // a reply longer than capacity() is answered UNAVAILABLE (the worker asks
  // again through gRPC, where a retry's duplicate gets its values in the
  // message). Wakes the worker.
  void Answer(uint32_t slot, uint32_t seq, const absl::Status& status,
              const grpc::ByteBuffer& reply);
  void Beat();

 private:
  char* Slot(uint32_t slot) const { return base_ + kDoorbellHeadBytes + uint64_t{slot} * slot_bytes_; }

  char* const base_;
  const uint32_t slots_;
  const uint32_t slot_bytes_;
};

}  // namespace grps

#endif  // GRPS_WIRE_LANE_DOORBELL_H_
