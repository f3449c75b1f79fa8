// Splits a dataset's examples among the workers of a job by rank.
#ifndef GRPS_DATA_PARTITION_H_
#define GRPS_DATA_PARTITION_H_

#include <cstdint>

#include "absl/status/statusor.h"

namespace grps {

// The contiguous block of example indices [begin, end) that one rank reads.
struct PartitionRange {
  int64_t begin = 0;
  int64_t end = 0;

  int64_t size() const { return end - begin; }
  bool operator==(const PartitionRange& other) const {
    return begin == other.begin && end == other.end;
  }
};

// Rank `rank` of `world_size` gets a contiguous block; the blocks of ranks
// 0, 1, ..., world_size - 1 follow each other and together hold every
// example exactly once. The first num_examples % world_size ranks get one
// example more than the others, so sizes differ by at most 1 (a rank gets
// an empty block when world_size > num_examples).
//
// InvalidArgument unless num_examples >= 0, world_size >= 1 and
// 0 <= rank < world_size.
absl::StatusOr<PartitionRange> PartitionForRank(int64_t num_examples,
                                                int rank, int world_size);

}  // namespace grps

#endif  // GRPS_DATA_PARTITION_H_
