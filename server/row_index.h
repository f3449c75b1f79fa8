// RowIndex: which slot holds the row of an id, for a shard's sparse rows
// (sparse_rows.h). Open addressing with linear probing over 4-byte slot
// numbers; the ids themselves live with the rows, and every call reads them
// through the owner's `id_of(slot)`. So an entry costs 4 bytes: 5 to 10 a
// row at the loads the index keeps (at most 4/5; growing doubles it), where
// a hash map of (id, slot) pairs costs 17 to 39. Deletion shifts the probe
// sequence back (no tombstones), so lookups never slow down as rows come and
// go.
//
// A lookup costs two cache misses on a big table (its entry, then the id of
// the slot there); ForEach looks up a batch with both prefetched some ids
// ahead, so that the misses of several lookups overlap.
//
// Thread safety: none (the owner's lock).
#ifndef GRPS_SERVER_ROW_INDEX_H_
#define GRPS_SERVER_ROW_INDEX_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/types/span.h"

namespace grps {

class RowIndex {
 public:
  using IdOf = absl::FunctionRef<int64_t(uint32_t slot)>;

  uint64_t size() const { return size_; }
  // Memory held: the table of slot numbers.
  uint64_t bytes() const { return table_.capacity() * sizeof(uint32_t); }

  // The slot of `id`, if indexed. `id_of(slot)`: the id of a slot (any
  // callable; a template so that the owner's accessor inlines).
  template <typename IdOfSlot>
  std::optional<uint32_t> Find(int64_t id, const IdOfSlot& id_of) const {
    if (size_ == 0) return std::nullopt;
    const uint64_t mask = table_.size() - 1;
    for (uint64_t i = Home(id);; i = (i + 1) & mask) {
      const uint32_t slot = table_[i];
      if (slot == kEmpty) return std::nullopt;
      if (id_of(slot) == id) return slot;
    }
  }
  // Calls found(i, Find(ids[i])) for each i in order, prefetching the index
  // entry kAhead * 2 ids ahead and, kAhead ahead, calling prefetch(slot) for
  // the slot there (the owner prefetches what id_of will read, and what it
  // will read itself). `found` may insert and erase.
  template <typename IdOfSlot, typename Prefetch, typename Found>
  void ForEach(absl::Span<const int64_t> ids, const IdOfSlot& id_of, const Prefetch& prefetch,
               Found found) const {
    constexpr size_t kAhead = 8;
    const size_t n = ids.size();
    for (size_t i = 0; i < n; ++i) {
      if (size_ != 0) {
        if (i + 2 * kAhead < n) __builtin_prefetch(&table_[Home(ids[i + 2 * kAhead])]);
        if (i + kAhead < n)
          if (const uint32_t slot = table_[Home(ids[i + kAhead])]; slot != kEmpty) prefetch(slot);
      }
      found(i, Find(ids[i], id_of));
    }
  }
  // Indexes `slot` (id_of(slot) must already be `id`), which must not be
  // indexed yet, nor `id`.
  void Insert(int64_t id, uint32_t slot, IdOf id_of);
  // Removes `id`; false when it was not indexed.
  bool Erase(int64_t id, IdOf id_of);
  // Room for `n` ids without growing.
  void Reserve(uint64_t n, IdOf id_of);
  void Clear();

 private:
  static constexpr uint32_t kEmpty = 0xffffffffu;
  uint64_t Home(int64_t id) const {
    // Fibonacci hashing of a mix of the id: the shard's own choice of rows
    // (SparseShardOf, another hash of the id) leaves no pattern here.
    uint64_t x = static_cast<uint64_t>(id) ^ 0x2545f4914f6cdd1dull;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return (x * 0x9e3779b97f4a7c15ull) >> shift_;
  }
  void Rehash(uint64_t capacity, IdOf id_of);

  std::vector<uint32_t> table_;  // a power of two entries, or none
  uint64_t size_ = 0;
  int shift_ = 64;  // 64 - log2(capacity)
};

}  // namespace grps

#endif  // GRPS_SERVER_ROW_INDEX_H_
