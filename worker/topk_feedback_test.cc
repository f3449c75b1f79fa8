// TopKFeedback: each push sends the largest values of gradient plus
// residual and keeps the rest; a retry sends the same; a roll-back forgets.
#include "worker/topk_feedback.h"

#include <cstring>
#include <vector>

#include "gtest/gtest.h"
#include "worker/testing/dealt_map.h"

namespace grps {
namespace {

struct Sent {
  std::vector<uint32_t> indices;
  std::vector<float> values;
  bool operator==(const Sent& o) const { return indices == o.indices && values == o.values; }
};

Sent Push(TopKFeedback& topk, uint64_t step, uint64_t generation, std::vector<float> grads) {
  std::vector<std::vector<WireChunk>> chunks(1, std::vector<WireChunk>(1));
  topk.Select(step, generation, grads.data(), DType::kF32, &chunks);
  const WireChunk& c = chunks[0][0];
  Sent sent;
  sent.indices.resize(c.indices.size() / sizeof(uint32_t));
  std::memcpy(sent.indices.data(), c.indices.data(), c.indices.size());
  sent.values.resize(c.owned.size() / sizeof(float));
  std::memcpy(sent.values.data(), c.owned.data(), c.owned.size());
  return sent;
}

TEST(TopKFeedback, SendsTheLargestFractionAndTheRestWithTheNextPush) {
  const ChunkLayout layout(DealtMap(1, 4, 1));
  TopKFeedback topk(0.5f, layout);
  EXPECT_EQ(Push(topk, 1, 0, {1, -5, 2, 0.5f}), (Sent{{1, 2}, {-5, 2}}));
  EXPECT_EQ(Push(topk, 2, 0, {0, 0, 0, 0}), (Sent{{0, 3}, {1, 0.5f}}));
}

TEST(TopKFeedback, ARetryOfAStepSendsTheSameSelection) {
  const ChunkLayout layout(DealtMap(1, 4, 1));
  TopKFeedback topk(0.5f, layout);
  Push(topk, 1, 0, {1, -5, 2, 0.5f});
  const Sent first = Push(topk, 2, 0, {0, 0, 3, 0});
  EXPECT_EQ(Push(topk, 2, 0, {0, 0, 3, 0}), first);
}

TEST(TopKFeedback, APushOfAnotherGenerationStartsFromAnEmptyResidual) {
  const ChunkLayout layout(DealtMap(1, 4, 1));
  TopKFeedback topk(0.5f, layout);
  Push(topk, 1, 0, {1, -5, 2, 0.5f});
  const Sent after_rollback = Push(topk, 1, 1, {0, 0, 0, 0});
  EXPECT_EQ(after_rollback.values, (std::vector<float>{0, 0}));
}

}  // namespace
}  // namespace grps
