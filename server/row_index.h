// RowIndex: which slot holds the row of an id, for a shard's sparse rows
// (sparse_rows.h). Open addressing with linear probing over 4-byte slot
// numbers; the ids themselves live with the rows, and every call reads them
// through the owner's `id_of(slot)`. So an entry costs 4 bytes: 5 to 10 a
// row at the loads the index keeps (at most 4/5; growing doubles it), where
// a hash map of (id, slot) pairs costs 17 to 39. Deletion shifts the probe
// sequence back (no tombstones), so lookups never slow down as rows come and
// go.
//
// Thread safety: none (the owner's lock).
#ifndef GRPS_SERVER_ROW_INDEX_H_
#define GRPS_SERVER_ROW_INDEX_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/functional/function_ref.h"

namespace grps {

class RowIndex {
 public:
  using IdOf = absl::FunctionRef<int64_t(uint32_t slot)>;

  uint64_t size() const { return size_; }
  // Memory held: the table of slot numbers.
  uint64_t bytes() const { return table_.capacity() * sizeof(uint32_t); }

  // The slot of `id`, if indexed.
  std::optional<uint32_t> Find(int64_t id, IdOf id_of) const;
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
  uint64_t Home(int64_t id) const;
  void Rehash(uint64_t capacity, IdOf id_of);

  std::vector<uint32_t> table_;  // a power of two entries, or none
  uint64_t size_ = 0;
  int shift_ = 64;  // 64 - log2(capacity)
};

}  // namespace grps

#endif  // GRPS_SERVER_ROW_INDEX_H_
