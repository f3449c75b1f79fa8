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

// ForEach answers as Find does for every id of a batch, in order, also
// while its callback inserts the ids it misses (as SparseRows creates the
// rows of a pull) and erases others, which moves and grows the table under
// its prefetching.
TEST(RowIndex, ForEachAnswersAsFindWhileItsCallbackInsertsAndErases) {
  std::vector<int64_t> id_of_slot;
  auto id_of = [&](uint32_t slot) { return id_of_slot[slot]; };
  auto insert = [&](RowIndex& index, int64_t id) {
    const uint32_t slot = static_cast<uint32_t>(id_of_slot.size());
    id_of_slot.push_back(id);
    index.Insert(id, slot, id_of);
    return slot;
  };
  RowIndex index;
  std::map<int64_t, uint32_t> want;
  std::mt19937_64 rng(7);
  for (int i = 0; i < 500; ++i) {
    const int64_t id = static_cast<int64_t>(rng() % 4000);
    if (!want.count(id)) want[id] = insert(index, id);
  }
  std::vector<int64_t> batch;  // repeats, misses, and ids inserted mid-batch seen again
  for (int i = 0; i < 5000; ++i) batch.push_back(static_cast<int64_t>(rng() % 4000));
  size_t calls = 0;
  int erased = 0;
  index.ForEach(
      batch, id_of, [&](uint32_t slot) { ASSERT_LT(slot, id_of_slot.size()); },
      [&](size_t i, std::optional<uint32_t> found) {
        ASSERT_EQ(i, calls++);
        auto it = want.find(batch[i]);
        ASSERT_EQ(found.has_value(), it != want.end()) << batch[i];
        if (found.has_value()) {
          ASSERT_EQ(*found, it->second);
        } else {
          want[batch[i]] = insert(index, batch[i]);
        }
        if (i % 7 == 0 && !want.empty()) {  // and one leaves
          auto gone = want.begin();
          std::advance(gone, static_cast<long>(rng() % want.size()));
          ASSERT_TRUE(index.Erase(gone->first, id_of));
          want.erase(gone);
          ++erased;
        }
      });
  EXPECT_EQ(calls, batch.size());
  EXPECT_GT(erased, 0);
  EXPECT_EQ(index.size(), want.size());
  RowIndex empty;
  size_t empty_calls = 0;
  empty.ForEach(
      batch, id_of, [](uint32_t) { FAIL() << "nothing to prefetch"; },
      [&](size_t, std::optional<uint32_t> found) {
        EXPECT_FALSE(found.has_value());
        ++empty_calls;
      });
  EXPECT_EQ(empty_calls, batch.size());
}

}  // namespace
}  // namespace grps
