#include "data/partition.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace grps {

absl::StatusOr<PartitionRange> PartitionForRank(int64_t num_examples,
                                                int rank, int world_size) {
  if (num_examples < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_examples must be >= 0, got ", num_examples));
  }
  if (world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("world size must be >= 1, got ", world_size));
  }
  if (rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", rank, " is outside [0, ", world_size, ")"));
  }
  const int64_t base = num_examples / world_size;
  const int64_t extra = num_examples % world_size;  // ranks below get +1
  PartitionRange range;
  range.begin = rank * base + (rank < extra ? rank : extra);
  range.end = range.begin + base + (rank < extra ? 1 : 0);
  return range;
}

}  // namespace grps
