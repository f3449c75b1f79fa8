// RowIndex against a std::map under random inserts and erases: every id
// found at its slot, none found once erased, whatever the probe runs.
#include "server/row_index.h"

#include <cstdint>
#include <map>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace grps {
namespace {

TEST(RowIndex, FindsWhatItHoldsThroughGrowthAndErasesAsAMapDoes) {
  std::vector<int64_t> id_of_slot;  // the owner's ids by slot
  std::vector<uint32_t> free_slots;
  auto id_of = [&](uint32_t slot) { return id_of_slot[slot]; };
  RowIndex index;
  std::map<int64_t, uint32_t> want;
  std::mt19937_64 rng(1);
  // Ids of one shard of two (as SparseShardOf leaves them) and nearby ones,
  // so that probe runs are long and wrap.
  std::vector<int64_t> pool;
  for (int64_t i = 0; i < 3000; ++i) pool.push_back(i * 2);
  for (int round = 0; round < 60000; ++round) {
    const int64_t id = pool[rng() % pool.size()];
    if (rng() % 3 != 0) {
      if (want.count(id)) continue;
      uint32_t slot;
      if (!free_slots.empty()) {
        slot = free_slots.back();
        free_slots.pop_back();
        id_of_slot[slot] = id;
      } else {
        slot = static_cast<uint32_t>(id_of_slot.size());
        id_of_slot.push_back(id);
      }
      index.Insert(id, slot, id_of);
      want[id] = slot;
    } else {
      const bool held = want.count(id) > 0;
      ASSERT_EQ(index.Erase(id, id_of), held) << id;
      if (held) {
        free_slots.push_back(want[id]);
        want.erase(id);
      }
    }
    if (round % 997 == 0) {
      ASSERT_EQ(index.size(), want.size());
      for (int64_t probe : pool) {
        auto it = want.find(probe);
        std::optional<uint32_t> got = index.Find(probe, id_of);
        ASSERT_EQ(got.has_value(), it != want.end()) << probe;
        if (got.has_value()) {
          ASSERT_EQ(*got, it->second);
        }
      }
      ASSERT_LE(index.size() * 5, index.bytes() / sizeof(uint32_t) * 4) << "load at most 4/5";
    }
  }
  index.Clear();
  EXPECT_EQ(index.size(), 0u);
  EXPECT_FALSE(index.Find(pool[0], id_of).has_value());
  EXPECT_FALSE(index.Erase(pool[0], id_of));
}

TEST(RowIndex, ReserveMakesRoomWithoutLosingIds) {
  std::vector<int64_t> ids = {5, -7, INT64_MIN, INT64_MAX, 0};
  auto id_of = [&](uint32_t slot) { return ids[slot]; };
  RowIndex index;
  for (uint32_t s = 0; s < ids.size(); ++s) index.Insert(ids[s], s, id_of);
  index.Reserve(100000, id_of);
  EXPECT_GE(index.bytes() / sizeof(uint32_t) * 4, 100000u * 5);
  for (uint32_t s = 0; s < ids.size(); ++s) EXPECT_EQ(index.Find(ids[s], id_of), s);
  EXPECT_FALSE(index.Find(6, id_of).has_value());
}

}  // namespace
}  // namespace grps
