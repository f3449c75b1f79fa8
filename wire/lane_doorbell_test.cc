// Lane doorbells: a request rung in a lane is the request the other side
// takes, an answer is the answer the ringer reads, across threads and
// processes, and neither side reads past a slot whatever the other wrote.
#include "wire/lane_doorbell.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "wire/shared_lane.h"
#include "wire/wire_format.h"

namespace grps {
namespace {

using ::testing::HasSubstr;

grpc::ByteBuffer Buffer(const std::string& bytes) {
  grpc::Slice slice(bytes.data(), bytes.size());
  return grpc::ByteBuffer(&slice, 1);
}

// A worker's lane with a doorbell area at its first value byte, and the
// shard's mapping of it: the two views every test rings between.
struct Pair {
  static constexpr uint32_t kSlots = 2;
  std::shared_ptr<LaneSegment> segment;
  std::shared_ptr<MappedLane> mapped;
  std::unique_ptr<LaneDoorbell> worker, shard;

  explicit Pair(uint32_t capacity = 256) {
    const uint32_t slot_bytes = LaneDoorbell::SlotBytesFor(capacity);
    const uint64_t area = LaneDoorbell::AreaBytes(kSlots, slot_bytes);
    segment = *LaneSegment::Create(area);
    mapped = *MappedLane::Open(segment->Ref());
    worker = std::make_unique<LaneDoorbell>(segment->base() + kLaneHeaderBytes, kSlots,
                                            slot_bytes);
    shard = std::make_unique<LaneDoorbell>(*mapped->At(kLaneHeaderBytes, area), kSlots,
                                           slot_bytes);
  }
};

TEST(LaneDoorbell, GeometryOutsideItsBoundsIsRefused) {
  EXPECT_TRUE(LaneDoorbell::CheckGeometry(1, kMinDoorbellSlotBytes).ok());
  EXPECT_TRUE(LaneDoorbell::CheckGeometry(kMaxDoorbellSlots, kMaxDoorbellSlotBytes).ok());
  EXPECT_TRUE(absl::IsInvalidArgument(LaneDoorbell::CheckGeometry(0, 1024)));
  EXPECT_TRUE(absl::IsInvalidArgument(LaneDoorbell::CheckGeometry(kMaxDoorbellSlots + 1, 1024)));
  EXPECT_TRUE(absl::IsInvalidArgument(LaneDoorbell::CheckGeometry(1, 64)));
  EXPECT_TRUE(absl::IsInvalidArgument(LaneDoorbell::CheckGeometry(1, 1000)))
      << "not a multiple of 64";
  EXPECT_TRUE(absl::IsInvalidArgument(LaneDoorbell::CheckGeometry(1, kMaxDoorbellSlotBytes + 64)));
  EXPECT_GE(LaneDoorbell(nullptr, 1, LaneDoorbell::SlotBytesFor(700)).capacity(), 700u);
}

TEST(LaneDoorbell, TheShardTakesWhatWasRungAndTheWorkerReadsTheAnswer) {
  Pair p;
  const uint32_t seen = p.shard->rings();
  std::thread shard([&] {
    p.shard->AwaitRing(seen, absl::Seconds(10));
    ASSERT_NE(p.shard->rings(), seen);
    const uint32_t seq = p.shard->request_seq(1);
    grpc::ByteBuffer request;
    ASSERT_TRUE(p.shard->TakeRequest(1, &request).ok());
    EXPECT_EQ(BufferBytes(request), "push of step 7");
    p.shard->Answer(1, seq, absl::OkStatus(), Buffer("versions 8"));
  });
  const uint32_t seq = p.worker->Ring(1, Buffer("push of step 7"));
  ASSERT_TRUE(p.worker->AwaitAnswer(1, seq, absl::Seconds(10)));
  grpc::ByteBuffer reply;
  ASSERT_TRUE(p.worker->TakeAnswer(1, &reply).ok());
  EXPECT_EQ(BufferBytes(reply), "versions 8");
  EXPECT_EQ(p.shard->answer_seq(1), seq);
  EXPECT_EQ(p.shard->answer_seq(0), 0u) << "the other slot is untouched";
  shard.join();
}

TEST(LaneDoorbell, AStatusTravelsWithItsCodeAndMessageCutToTheSlot) {
  Pair p(256);
  const uint32_t seq = p.worker->Ring(0, Buffer("x"));
  p.shard->Answer(0, seq, absl::AbortedError("the job rolled back"), {});
  grpc::ByteBuffer reply;
  absl::Status s = p.worker->TakeAnswer(0, &reply);
  EXPECT_TRUE(absl::IsAborted(s)) << s;
  EXPECT_EQ(s.message(), "the job rolled back");

  const uint32_t again = p.worker->Ring(0, Buffer("y"));
  p.shard->Answer(0, again, absl::InvalidArgumentError(std::string(5000, 'm')), {});
  s = p.worker->TakeAnswer(0, &reply);
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_EQ(s.message().size(), p.worker->capacity());
}

TEST(LaneDoorbell, AReplyLargerThanTheSlotIsAnsweredUnavailable) {
  Pair p(256);
  const uint32_t seq = p.worker->Ring(0, Buffer("x"));
  p.shard->Answer(0, seq, absl::OkStatus(), Buffer(std::string(p.shard->capacity() + 1, 'w')));
  grpc::ByteBuffer reply;
  absl::Status s = p.worker->TakeAnswer(0, &reply);
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("ask through gRPC"));
}

TEST(LaneDoorbell, LengthsAndCodesOutsideTheSlotAreRefusedOnBothSides) {
  Pair p(256);
  char* worker_slot = p.segment->base() + kLaneHeaderBytes + kDoorbellHeadBytes;
  // The worker claims a request longer than the slot: the shard reads none of it.
  p.worker->Ring(0, Buffer("x"));
  const uint32_t huge = 1u << 30;
  std::memcpy(worker_slot + 8, &huge, 4);
  grpc::ByteBuffer request;
  EXPECT_TRUE(absl::IsInvalidArgument(p.shard->TakeRequest(0, &request)));
  const uint32_t zero = 0;
  std::memcpy(worker_slot + 8, &zero, 4);
  EXPECT_TRUE(absl::IsInvalidArgument(p.shard->TakeRequest(0, &request))) << "an empty request";
  // An answer that claims more bytes, or a code no status has: DATA_LOSS.
  p.shard->Answer(0, 1, absl::OkStatus(), Buffer("ok"));
  std::memcpy(worker_slot + 16, &huge, 4);
  grpc::ByteBuffer reply;
  EXPECT_TRUE(absl::IsDataLoss(p.worker->TakeAnswer(0, &reply)));
  p.shard->Answer(0, 1, absl::OkStatus(), Buffer("ok"));
  const uint32_t code = 99;
  std::memcpy(worker_slot + 12, &code, 4);
  EXPECT_TRUE(absl::IsDataLoss(p.worker->TakeAnswer(0, &reply)));
}

TEST(LaneDoorbell, AWaitWithoutAnAnswerEndsAtItsTimeout) {
  Pair p;
  const uint32_t seq = p.worker->Ring(0, Buffer("x"));
  const absl::Time start = absl::Now();
  EXPECT_FALSE(p.worker->AwaitAnswer(0, seq, absl::Milliseconds(50)));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(45));
  const uint32_t rings = p.shard->rings();
  p.shard->AwaitRing(rings, absl::Milliseconds(20));  // returns: nobody rang
  std::thread waker([&] {
    absl::SleepFor(absl::Milliseconds(20));
    p.shard->Wake();
  });
  p.shard->AwaitRing(rings, absl::Seconds(10));  // Wake ends it early
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  waker.join();
  const uint32_t beat = p.worker->beat();
  p.shard->Beat();
  EXPECT_EQ(p.worker->beat(), beat + 1);
}

TEST(LaneDoorbell, RingsAndAnswersCrossProcesses) {
  Pair p;
  constexpr int kRounds = 200;
  const absl::Time start = absl::Now();
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // The shard: its own process, sharing only the lane's memory.
    // Each pass looks at the slot after noting the rings: a ring after the
    // note ends the wait at once, so none is missed.
    uint32_t served = 0;
    const absl::Time give_up = absl::Now() + absl::Seconds(30);
    for (int round = 0; round < kRounds;) {
      if (absl::Now() > give_up) _exit(3);
      const uint32_t seen = p.shard->rings();
      const uint32_t seq = p.shard->request_seq(0);
      if (seq == served) {
        p.shard->AwaitRing(seen, absl::Seconds(5));
        continue;
      }
      served = seq;
      grpc::ByteBuffer request;
      if (!p.shard->TakeRequest(0, &request).ok()) _exit(2);
      p.shard->Answer(0, seq, absl::OkStatus(), Buffer(BufferBytes(request) + " done"));
      ++round;
    }
    _exit(0);
  }
  for (int round = 0; round < kRounds; ++round) {
    const std::string request = "step " + std::to_string(round);
    const uint32_t seq = p.worker->Ring(0, Buffer(request));
    ASSERT_TRUE(p.worker->AwaitAnswer(0, seq, absl::Seconds(10))) << round;
    grpc::ByteBuffer reply;
    ASSERT_TRUE(p.worker->TakeAnswer(0, &reply).ok());
    EXPECT_EQ(BufferBytes(reply), request + " done");
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  // No ring was lost (a lost one would wait out the child's 5 s).
  EXPECT_LT(absl::Now() - start, absl::Seconds(4));
}

}  // namespace
}  // namespace grps
