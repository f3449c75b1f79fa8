// ShardMap: how a model's dense tensors are cut into chunks and placed on
// shards. Deterministic: the same tensors, shard count and chunk size give the
// same map on every machine.
#ifndef GRPS_JOB_SHARD_MAP_H_
#define GRPS_JOB_SHARD_MAP_H_

#include <cstdint>
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

// Checks a map received from the network: tensor indices, offsets and sizes
// in range, chunks of a tensor tiling it exactly, shards in range.
absl::Status ValidateShardMap(const v1::ShardMap& map);

// Number of elements of a tensor (product of its shape).
int64_t NumElements(const v1::TensorSpec& tensor);

// The chunk ids owned by `shard`, ascending.
std::vector<uint32_t> ChunksOfShard(const v1::ShardMap& map, uint32_t shard);

// Bytes (f32) held by each shard.
std::vector<uint64_t> BytesPerShard(const v1::ShardMap& map);

}  // namespace grps

#endif  // GRPS_JOB_SHARD_MAP_H_
