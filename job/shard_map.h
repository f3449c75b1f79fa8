// ShardMap: how a model's dense tensors are cut into chunks and placed on
// shards. Deterministic: the same tensors, shard count and chunk size give the
// same map on every machine.
#ifndef GRPS_JOB_SHARD_MAP_H_
#define GRPS_JOB_SHARD_MAP_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/grps.pb.h"

namespace grps {


// Cuts each tensor into chunks of at most chunk_bytes / 4 elements (equal
// sizes within a tensor, so no tiny tail chunk), then places chunks, largest
// first, each on the shard with the fewest bytes so far (ties: lower shard).
// Chunk ids follow tensor order then offset. Endpoints are left empty (one
// ShardEndpoint per shard with its index set).
absl::StatusOr<v1::ShardMap> BuildShardMap(
    const std::vector<v1::TensorSpec>& tensors, uint32_t num_shards,
    uint64_t chunk_bytes);

// Checks a map received from the network or read from a file: tensor
// indices, offsets and sizes in range, each tensor's element count within
// 64 bits (CheckedNumElements), chunks of a tensor tiling it exactly, shards
// in range.
absl::Status ValidateShardMap(const v1::ShardMap& map);

// Number of elements of a tensor (product of its shape), for a shape checked
// already (ValidateShardMap, ValidateUserModel, a built-in model's).
int64_t NumElements(const v1::TensorSpec& tensor);

// The same for a shape that came from outside: nullopt when a dim is below 1
// or the product passes INT64_MAX (where NumElements would wrap, to 0 or to
// any other count).
std::optional<uint64_t> CheckedNumElements(const v1::TensorSpec& tensor);

// How many chunks BuildShardMap cuts a tensor of `elements` elements into
// at `chunk_bytes` (0 for none).
uint64_t ChunksOfTensor(uint64_t elements, uint64_t chunk_bytes);

// The chunk ids owned by `shard`, ascending.
std::vector<uint32_t> ChunksOfShard(const v1::ShardMap& map, uint32_t shard);

// Bytes (f32) held by each shard.
std::vector<uint64_t> BytesPerShard(const v1::ShardMap& map);

}  // namespace grps

#endif  // GRPS_JOB_SHARD_MAP_H_
