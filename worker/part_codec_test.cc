// Part codec: a push's values put as slices, converted copies or into the
// lane; a reply read into the flat array only for the chunks of its part.
#include "worker/part_codec.h"

#include <atomic>
#include <vector>

#include "gtest/gtest.h"
#include "worker/testing/dealt_map.h"

namespace grps {
namespace {

std::vector<WireChunk> Heads(const std::vector<uint32_t>& ids) {
  std::vector<WireChunk> chunks(ids.size());
  for (size_t k = 0; k < ids.size(); ++k) chunks[k].chunk_id = ids[k];
  return chunks;
}

WireChunk Values(uint32_t id, uint64_t version, std::vector<float> values) {
  WireChunk c;
  c.chunk_id = id;
  c.version = version;
  c.owned.assign(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
  return c;
}

class PartCodecTest : public ::testing::Test {
 protected:
  std::vector<WireChunk> Chunks(std::vector<WireChunk> a) { return a; }

  // 4 chunks of 2 floats over 2 shards: part 0 holds chunks 0 and 2
  // (shard 0), part 1 chunks 1 and 3 (shard 1).
  const ChunkLayout layout_{DealtMap(4, 2, 2)};
  const std::vector<float> grads_{0, 1, 2, 3, 4, 5, 6, 7};
  std::vector<float> params_ = std::vector<float>(8, -1);
  std::vector<std::atomic<uint64_t>> versions_ = std::vector<std::atomic<uint64_t>>(4);
};

TEST_F(PartCodecTest, AnF32PushSlicesTheGradientsWithoutCopying) {
  std::vector<WireChunk> chunks = Heads({0, 2});
  EXPECT_EQ(PutPushValues(layout_, grads_.data(), DType::kF32, nullptr, 0, &chunks), 0u);
  EXPECT_EQ(chunks[1].external, grads_.data() + 4);
  EXPECT_EQ(chunks[1].external_bytes, 2 * sizeof(float));
  EXPECT_TRUE(chunks[1].owned.empty());
}

TEST_F(PartCodecTest, ABf16PushConvertsTheGradientsIntoEachChunksBytes) {
  std::vector<WireChunk> chunks = Heads({1, 3});
  PutPushValues(layout_, grads_.data(), DType::kBF16, nullptr, 1, &chunks);
  EXPECT_EQ(chunks[0].external, nullptr);
  EXPECT_EQ(chunks[0].owned.size(), 2 * DTypeSize(DType::kBF16));
}

TEST_F(PartCodecTest, ALanePushCopiesTheGradientsIntoItsPlaceBackToBack) {
  v1::JobConfig config;
  config.set_local_transport(v1::LOCAL_TRANSPORT_SHARED_MEMORY);
  PushLanes lanes(config, layout_);
  std::shared_ptr<PushLane> lane = lanes.Take(1, 1);
  ASSERT_NE(lane, nullptr);
  std::vector<WireChunk> chunks = Heads({1, 3});
  EXPECT_EQ(PutPushValues(layout_, grads_.data(), DType::kF32, lane.get(), 1, &chunks),
            4 * sizeof(float));
  EXPECT_EQ(chunks[0].lane_offset, lane->place[1]);
  EXPECT_EQ(chunks[1].lane_offset, lane->place[1] + 2 * sizeof(float));
  const float* in_lane = reinterpret_cast<const float*>(lane->segment->base() + lane->place[1]);
  EXPECT_EQ(std::vector<float>(in_lane, in_lane + 4), (std::vector<float>{2, 3, 6, 7}));
}

TEST_F(PartCodecTest, APullReplyFillsItsChunksAndTheirVersions) {
  const grpc::ByteBuffer reply = EncodePullResponse(
      v1::DTYPE_F32, Chunks({Values(0, 5, {10, 11}), Values(2, 6, {12, 13})}));
  ReplyRead read;
  ASSERT_TRUE(
      ReadPartReply(layout_, 0, nullptr, reply, nullptr, params_.data(), &versions_, &read).ok());
  EXPECT_EQ(params_, (std::vector<float>{10, 11, -1, -1, 12, 13, -1, -1}));
  EXPECT_EQ(versions_[2].load(), 6u);
  EXPECT_TRUE(read.complete);
  EXPECT_EQ(read.bytes, 4 * sizeof(float));
}

TEST_F(PartCodecTest, APullReplyMissingAChunkOfItsPartIsDataLoss) {
  const grpc::ByteBuffer reply =
      EncodePullResponse(v1::DTYPE_F32, Chunks({Values(0, 5, {10, 11})}));
  ReplyRead read;
  EXPECT_TRUE(absl::IsDataLoss(
      ReadPartReply(layout_, 0, nullptr, reply, nullptr, params_.data(), &versions_, &read)));
}

TEST_F(PartCodecTest, AReplyWithAChunkOfAnotherPartIsDataLoss) {
  const grpc::ByteBuffer reply = EncodePullResponse(
      v1::DTYPE_F32, Chunks({Values(0, 5, {10, 11}), Values(1, 5, {12, 13})}));
  ReplyRead read;
  EXPECT_TRUE(absl::IsDataLoss(
      ReadPartReply(layout_, 0, nullptr, reply, nullptr, params_.data(), &versions_, &read)));
  EXPECT_EQ(params_[2], -1);
}

TEST_F(PartCodecTest, AFusedPushsReplyBringsAllItsChunksOrNone) {
  v1::PushResponse header;
  header.set_late(3);
  v1::PushResponse read_header;
  ReplyRead read;
  ASSERT_TRUE(ReadPartReply(layout_, 0, nullptr, EncodePushResponse(header, v1::DTYPE_F32, {}),
                            &read_header, params_.data(), &versions_, &read)
                  .ok());
  EXPECT_FALSE(read.complete);
  EXPECT_EQ(read_header.late(), 3u);
  EXPECT_TRUE(absl::IsDataLoss(ReadPartReply(
      layout_, 0, nullptr,
      EncodePushResponse(header, v1::DTYPE_F32, Chunks({Values(0, 1, {1, 2})})), &read_header,
      params_.data(), &versions_, &read)));
}

TEST_F(PartCodecTest, ValuesNamedInTheLaneOutsideThePartsPlaceAreDataLoss) {
  WireChunk in_lane;
  in_lane.chunk_id = 0;
  in_lane.lane_offset = 64;
  const grpc::ByteBuffer reply =
      EncodePushResponse(v1::PushResponse(), v1::DTYPE_F32, Chunks({std::move(in_lane)}));
  v1::PushResponse header;
  ReplyRead read;
  EXPECT_TRUE(absl::IsDataLoss(
      ReadPartReply(layout_, 0, nullptr, reply, &header, params_.data(), &versions_, &read)));
}

}  // namespace
}  // namespace grps
