#include "server/row_index.h"

#include <algorithm>

namespace grps {
namespace {

constexpr uint64_t kMinCapacity = 16;

// Whether `capacity` entries may hold `n` ids (a load of at most 4/5).
bool Fits(uint64_t n, uint64_t capacity) { return n * 5 <= capacity * 4; }

}  // namespace

void RowIndex::Insert(int64_t id, uint32_t slot, IdOf id_of) {
  if (!Fits(size_ + 1, table_.size()))
    Rehash(std::max<uint64_t>(kMinCapacity, table_.size() * 2), id_of);
  const uint64_t mask = table_.size() - 1;
  uint64_t i = Home(id);
  while (table_[i] != kEmpty) i = (i + 1) & mask;
  table_[i] = slot;
  ++size_;
}

bool RowIndex::Erase(int64_t id, IdOf id_of) {
  if (size_ == 0) return false;
  const uint64_t mask = table_.size() - 1;
  uint64_t hole = Home(id);
  while (true) {
    if (table_[hole] == kEmpty) return false;
    if (id_of(table_[hole]) == id) break;
    hole = (hole + 1) & mask;
  }
  // Shift back every later entry of the run whose home does not lie
  // cyclically in (hole, j]: it may then sit in the hole.
  for (uint64_t j = (hole + 1) & mask; table_[j] != kEmpty; j = (j + 1) & mask) {
    const uint64_t home = Home(id_of(table_[j]));
    const bool stays = hole <= j ? (hole < home && home <= j) : (hole < home || home <= j);
    if (stays) continue;
    table_[hole] = table_[j];
    hole = j;
  }
  table_[hole] = kEmpty;
  --size_;
  return true;
}

void RowIndex::Reserve(uint64_t n, IdOf id_of) {
  uint64_t capacity = std::max<uint64_t>(kMinCapacity, table_.size());
  while (!Fits(n, capacity)) capacity *= 2;
  if (capacity != table_.size()) Rehash(capacity, id_of);
}

void RowIndex::Clear() {
  std::vector<uint32_t>().swap(table_);
  size_ = 0;
  shift_ = 64;
}

void RowIndex::Rehash(uint64_t capacity, IdOf id_of) {
  std::vector<uint32_t> old;
  old.swap(table_);
  table_.assign(capacity, kEmpty);
  shift_ = 64 - __builtin_ctzll(capacity);
  const uint64_t mask = capacity - 1;
  for (uint32_t slot : old) {
    if (slot == kEmpty) continue;
    uint64_t i = Home(id_of(slot));
    while (table_[i] != kEmpty) i = (i + 1) & mask;
    table_[i] = slot;
  }
}

}  // namespace grps
