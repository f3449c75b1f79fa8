// EpochShuffler: the order in which a worker visits its partition's
// examples in each epoch.
#ifndef GRPS_DATA_EPOCH_SHUFFLER_H_
#define GRPS_DATA_EPOCH_SHUFFLER_H_

#include <cstdint>
#include <vector>

#include "data/partition.h"

namespace grps {

// A deterministic permutation of the indices of a PartitionRange for each
// (seed, epoch). The order is a pure function of (seed, epoch, range) and is
// identical on every machine, compiler and standard library, so a restarted
// or rescheduled worker replays exactly the same batches. The algorithm is
// fixed (changing it is a breaking change, pinned by a test):
//
//   key    = SplitMix64(SplitMix64(seed) ^ epoch)
//   engine = std::mt19937_64(key)     (its output sequence is fixed by the
//                                      C++ standard)
//   order  = [0, 1, ..., n - 1]
//   for i = n - 1 down to 1:          (Fisher-Yates)
//     j = UniformBelow(engine, i + 1)
//     swap(order[i], order[j])
//   result = range.begin + order[k] for each k
//
// UniformBelow(engine, m) draws x = engine() until x >= (2^64 - m) mod m and
// returns x mod m: unbiased, and unlike std::uniform_int_distribution or
// std::shuffle, specified here rather than by the library.
//
// The order does not depend on the rank: workers that want different orders
// for equally sized partitions mix their rank into the seed.
// Immutable; safe to use from several threads.
class EpochShuffler {
 public:
  EpochShuffler(uint64_t seed, PartitionRange range)
      : seed_(seed), range_(range) {}

  // The range's indices in epoch `epoch`'s order (range.size() of them).
  std::vector<int64_t> Order(uint64_t epoch) const;

  uint64_t seed() const { return seed_; }
  const PartitionRange& range() const { return range_; }

 private:
  uint64_t seed_;
  PartitionRange range_;
};

}  // namespace grps

#endif  // GRPS_DATA_EPOCH_SHUFFLER_H_
