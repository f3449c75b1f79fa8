// ChunkLayout: where each chunk sits in the flat array, and how each
// shard's chunks are cut into parts (requests) and ordered.
#include "worker/chunk_layout.h"

#include <vector>

#include "gtest/gtest.h"

namespace grps {
namespace {

// A map of one tensor per entry of `tensor_sizes`, each cut into chunks of
// at most `chunk_elements`, dealt over `shards` shards in turn.
v1::ShardMap MapOf(const std::vector<int64_t>& tensor_sizes, int64_t chunk_elements,
                   uint32_t shards) {
  v1::ShardMap map;
  uint32_t id = 0;
  for (size_t t = 0; t < tensor_sizes.size(); ++t) {
    v1::TensorSpec* tensor = map.add_tensors();
    tensor->set_name("t" + std::to_string(t));
    tensor->add_shape(tensor_sizes[t]);
    for (int64_t at = 0; at < tensor_sizes[t]; at += chunk_elements, ++id) {
      v1::ChunkSpec* c = map.add_chunks();
      c->set_chunk_id(id);
      c->set_tensor_index(static_cast<uint32_t>(t));
      c->set_offset(at);
      c->set_num_elements(std::min(chunk_elements, tensor_sizes[t] - at));
      c->set_shard(id % shards);
    }
  }
  for (uint32_t s = 0; s < shards; ++s) map.add_shards()->set_shard(s);
  return map;
}

std::vector<uint32_t> Ids(uint32_t first, uint32_t step, uint32_t count) {
  std::vector<uint32_t> ids;
  for (uint32_t i = 0; i < count; ++i) ids.push_back(first + i * step);
  return ids;
}

TEST(ChunkLayout, LaysTheTensorsBackToBackAndEachChunkAtItsTensorsOffset) {
  const ChunkLayout layout(MapOf({4, 6}, 3, 2));
  EXPECT_EQ(layout.num_parameters(), 10);
  ASSERT_EQ(layout.num_chunks(), 4u);  // t0: [0,3) [3,4); t1: [0,3) [3,6)
  EXPECT_EQ(layout.offset(0), 0);
  EXPECT_EQ(layout.offset(1), 3);
  EXPECT_EQ(layout.offset(2), 4);
  EXPECT_EQ(layout.offset(3), 7);
  EXPECT_EQ(layout.num_elements(1), 1u);
  EXPECT_EQ(layout.tensor_chunks(0), (std::vector<uint32_t>{0, 1}));
  EXPECT_EQ(layout.tensor_chunks(1), (std::vector<uint32_t>{2, 3}));
}

TEST(ChunkLayout, BackwardOrderIsTheLastTensorsPartsFirstEachTensorsInTheModelsOrder) {
  // Three tensors of a part's worth of chunks each over 2 shards: tensor 0
  // parts 0 and 1, tensor 1 parts 2 and 3, tensor 2 parts 4 and 5.
  const int64_t part = ChunkLayout::kPartBytes / sizeof(float);
  const ChunkLayout layout(MapOf({2 * part, 2 * part, 2 * part}, part, 2));
  ASSERT_EQ(layout.parts().size(), 6u);
  EXPECT_EQ(layout.BackwardOrder(), (std::vector<size_t>{4, 5, 2, 3, 0, 1}));
}

TEST(ChunkLayout, CutsEachShardsChunksIntoPartsOfAtMostPartBytesInTheModelsOrder) {
  // 16 chunks of 64 KiB over 2 shards: 4 to a part, the parts ordered by
  // their first chunk.
  const int64_t elements = (ChunkLayout::kPartBytes / 4) / sizeof(float);
  const ChunkLayout layout(MapOf({16 * elements}, elements, 2));
  const std::vector<ChunkLayout::Part>& parts = layout.parts();
  ASSERT_EQ(parts.size(), 4u);
  EXPECT_EQ(parts[0].chunk_ids, Ids(0, 2, 4));
  EXPECT_EQ(parts[1].chunk_ids, Ids(1, 2, 4));
  EXPECT_EQ(parts[2].chunk_ids, Ids(8, 2, 4));
  EXPECT_EQ(parts[3].chunk_ids, Ids(9, 2, 4));
  EXPECT_EQ(parts[0].shard, 0u);
  EXPECT_EQ(parts[1].shard, 1u);
  EXPECT_EQ(layout.part_of(8), 2u);
  EXPECT_EQ(layout.part_of(15), 3u);
}

TEST(ChunkLayout, EachShardsPartsHoldAtMostThatShardsPartBytes) {
  // 16 chunks of 64 KiB over 2 shards: shard 0's 8 in parts of 256 KiB,
  // shard 1's in one of 1 MiB.
  const int64_t elements = (size_t{64} << 10) / sizeof(float);
  const ChunkLayout layout(MapOf({16 * elements}, elements, 2),
                           {size_t{256} << 10, size_t{1} << 20});
  const std::vector<ChunkLayout::Part>& parts = layout.parts();
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[0].chunk_ids, Ids(0, 2, 4));
  EXPECT_EQ(parts[1].chunk_ids, Ids(1, 2, 8));
  EXPECT_EQ(parts[2].chunk_ids, Ids(8, 2, 4));
  EXPECT_EQ(parts[1].shard, 1u);
}

// Chosen by the link: parts of 4 MiB to a shard at an address of this
// machine, of 256 KiB to any other; the job's part_bytes, when set, for
// every shard.
TEST(ChunkLayout, PartBytesAreTheJobsOrChosenByWhereTheShardIs) {
  v1::ShardMap map = MapOf({16}, 4, 3);
  map.mutable_shards(0)->set_address("127.0.0.1:7070");
  map.mutable_shards(1)->set_address("192.0.2.1:7070");  // documentation: no interface
  map.mutable_shards(2)->set_address("[::1]:7070");
  v1::JobConfig config;
  EXPECT_EQ(ChunkLayout::PartBytesFor(config, map),
            (std::vector<size_t>{ChunkLayout::kLocalPartBytes, ChunkLayout::kPartBytes,
                                 ChunkLayout::kLocalPartBytes}));
  config.set_part_bytes(size_t{64} << 10);
  EXPECT_EQ(ChunkLayout::PartBytesFor(config, map), std::vector<size_t>(3, size_t{64} << 10));
}

TEST(ChunkLayout, AChunkLargerThanAPartTravelsAlone) {
  const int64_t big = ChunkLayout::kPartBytes / sizeof(float) + 1;
  const ChunkLayout layout(MapOf({big, 1, 1}, big, 1));
  ASSERT_EQ(layout.parts().size(), 2u);
  EXPECT_EQ(layout.parts()[0].chunk_ids, (std::vector<uint32_t>{0}));
  EXPECT_EQ(layout.parts()[1].chunk_ids, (std::vector<uint32_t>{1, 2}));
  // A part's values in f32.
  EXPECT_EQ(layout.part_bytes(0), big * sizeof(float));
  EXPECT_EQ(layout.part_bytes(1), 2 * sizeof(float));
}

TEST(ChunkLayout, RunsHoldAtMostMaxBytesOfEverySlotShardByShard) {
  // 6 chunks of 10 floats over 2 shards; 2 slots: 80 bytes a chunk.
  const ChunkLayout layout(MapOf({60}, 10, 2));
  const std::vector<ChunkLayout::Part> runs = layout.Runs(2, 160);
  ASSERT_EQ(runs.size(), 4u);
  EXPECT_EQ(runs[0].shard, 0u);
  EXPECT_EQ(runs[0].chunk_ids, (std::vector<uint32_t>{0, 2}));
  EXPECT_EQ(runs[1].chunk_ids, (std::vector<uint32_t>{4}));
  EXPECT_EQ(runs[2].shard, 1u);
  EXPECT_EQ(runs[2].chunk_ids, (std::vector<uint32_t>{1, 3}));
  // No slots still counts each chunk's values once.
  EXPECT_EQ(layout.Runs(0, 80).size(), 4u);
}

}  // namespace
}  // namespace grps
