// PushLanes: a place of the lane serves one push at a time; a shard that
// refuses the lane gets bytes; a push that may have been accepted retires
// the lane; a shard that serves its doorbell is rung there.
#include "worker/push_lanes.h"

#include <string>
#include <thread>

#include "gtest/gtest.h"
#include "worker/testing/dealt_map.h"

namespace grps {
namespace {

v1::JobConfig Config(v1::LocalTransport transport, float topk = 0) {
  v1::JobConfig config;
  config.set_job_id("lanes-test");
  config.set_local_transport(transport);
  config.set_gradient_topk(topk);
  return config;
}

grpc::ByteBuffer Bytes(const std::string& s) {
  grpc::Slice slice(s);
  return grpc::ByteBuffer(&slice, 1);
}

class PushLanesTest : public ::testing::Test {
 protected:
  // 4 chunks of 8 floats over 2 shards: a part per shard.
  const ChunkLayout layout_{DealtMap(4, 8, 2)};
};

TEST_F(PushLanesTest, AJobThatAsksForGrpcHasNoLane) {
  PushLanes lanes(Config(v1::LOCAL_TRANSPORT_GRPC), layout_);
  EXPECT_FALSE(lanes.Usable(0));
  EXPECT_EQ(lanes.Take(0, 0), nullptr);
}

TEST_F(PushLanesTest, TopKGradientsHaveNoLane) {
  PushLanes lanes(Config(v1::LOCAL_TRANSPORT_SHARED_MEMORY, 0.1f), layout_);
  EXPECT_FALSE(lanes.Usable(0));
}

TEST_F(PushLanesTest, APlaceServesOnePushAtATime) {
  PushLanes lanes(Config(v1::LOCAL_TRANSPORT_SHARED_MEMORY), layout_);
  ASSERT_TRUE(lanes.Usable(0));
  std::shared_ptr<PushLane> lane = lanes.Take(0, 0);
  ASSERT_NE(lane, nullptr);
  EXPECT_EQ(lanes.Take(0, 0), nullptr);
  EXPECT_NE(lanes.Take(1, 1), nullptr);  // another part's place
  lanes.CallEnded(lane, 0, 0, absl::OkStatus(), false);
  EXPECT_EQ(lanes.Take(0, 0), lane);
}

TEST_F(PushLanesTest, AShardThatRefusesTheLaneGetsBytesFromThenOn) {
  PushLanes lanes(Config(v1::LOCAL_TRANSPORT_SHARED_MEMORY), layout_);
  std::shared_ptr<PushLane> lane = lanes.Take(0, 0);
  lanes.CallEnded(lane, 0, 0, absl::UnimplementedError("no lanes here"), false);
  EXPECT_FALSE(lanes.Usable(0));
  EXPECT_EQ(lanes.Take(0, 0), nullptr);
  EXPECT_TRUE(lanes.Usable(1));
}

TEST_F(PushLanesTest, APushTheShardMayHaveAcceptedRetiresTheLane) {
  PushLanes lanes(Config(v1::LOCAL_TRANSPORT_SHARED_MEMORY), layout_);
  std::shared_ptr<PushLane> lane = lanes.Take(0, 0);
  lanes.CallEnded(lane, 0, 0, absl::DeadlineExceededError("late"), false);
  std::shared_ptr<PushLane> fresh = lanes.Take(0, 0);
  ASSERT_NE(fresh, nullptr);
  EXPECT_NE(fresh, lane);
  EXPECT_TRUE(lane->busy[0].load());  // the old place is never used again
}

TEST_F(PushLanesTest, AShardWhoseReplySaysItServesTheDoorbellIsRungThere) {
  PushLanes lanes(Config(v1::LOCAL_TRANSPORT_SHARED_MEMORY), layout_);
  std::shared_ptr<PushLane> lane = lanes.Take(0, 0);
  EXPECT_FALSE(lane->CanRing(0, 10));
  lanes.CallEnded(lane, 0, 0, absl::OkStatus(), /*doorbell=*/true);
  EXPECT_TRUE(lane->CanRing(0, 10));
  EXPECT_FALSE(lane->CanRing(0, lane->doorbell[0].capacity() + 1));
  EXPECT_FALSE(lane->CanRing(1, 10));
}

TEST_F(PushLanesTest, ARefNamesThePlaceForTheWeightsOnlyWithAPull) {
  PushLanes lanes(Config(v1::LOCAL_TRANSPORT_SHARED_MEMORY), layout_);
  std::shared_ptr<PushLane> lane = lanes.Take(1, 1);
  EXPECT_EQ(lane->RefFor(1, 1, true).reply_offset(), lane->place[1]);
  EXPECT_EQ(lane->RefFor(1, 1, false).reply_offset(), 0u);
  EXPECT_EQ(lane->RefFor(1, 1, false).doorbell_offset(), lane->doorbell_offset[1]);
}

TEST_F(PushLanesTest, WithinReadsOnlyInsideThePartsPlace) {
  PushLanes lanes(Config(v1::LOCAL_TRANSPORT_SHARED_MEMORY), layout_);
  std::shared_ptr<PushLane> lane = lanes.Take(0, 0);
  EXPECT_EQ(lane->Within(0, lane->place[0], lane->bytes[0]),
            lane->segment->base() + lane->place[0]);
  EXPECT_EQ(lane->Within(0, lane->place[0] + 4, lane->bytes[0]), nullptr);
  EXPECT_EQ(lane->Within(0, lane->place[1], 4), nullptr);
}

TEST_F(PushLanesTest, ARungPushGetsTheShardsAnswer) {
  PushLanes lanes(Config(v1::LOCAL_TRANSPORT_SHARED_MEMORY), layout_);
  std::shared_ptr<PushLane> lane = lanes.Take(0, 0);
  const uint32_t seq = lane->Ring(0, 0, Bytes("request"));
  std::thread shard([&] {
    LaneDoorbell& bell = lane->doorbell[0];
    grpc::ByteBuffer request;
    ASSERT_TRUE(bell.TakeRequest(lane->slot[0], &request).ok());
    bell.Answer(lane->slot[0], seq, absl::OkStatus(), Bytes("reply"));
  });
  grpc::ByteBuffer reply;
  EXPECT_TRUE(lane->AwaitAnswer(0, 0, seq, absl::Now(), absl::Seconds(10), &reply).ok());
  shard.join();
  EXPECT_EQ(reply.Length(), 5u);
}

TEST_F(PushLanesTest, ARungPushUnansweredFailsAtItsDeadlineOrWhenTheShardStopsBeating) {
  PushLanes lanes(Config(v1::LOCAL_TRANSPORT_SHARED_MEMORY), layout_);
  std::shared_ptr<PushLane> lane = lanes.Take(0, 0);
  const uint32_t seq = lane->Ring(0, 0, Bytes("request"));
  grpc::ByteBuffer reply;
  EXPECT_TRUE(absl::IsDeadlineExceeded(
      lane->AwaitAnswer(0, 0, seq, absl::Now(), absl::Milliseconds(50), &reply)));
  EXPECT_TRUE(absl::IsUnavailable(
      lane->AwaitAnswer(0, 0, seq, absl::Now(), absl::Seconds(30), &reply)));
}

}  // namespace
}  // namespace grps
