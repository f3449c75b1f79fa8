// ChunkLayout: where a model's chunks sit in a worker's flat parameter
// array, and the parts (requests) that carry them to their shards; and
// FitShardMap, whether a newer shard map keeps that layout.
//
//   ChunkLayout layout(map);
//   for (const ChunkLayout::Part& part : layout.parts())
//     for (uint32_t id : part.chunk_ids)
//       Send(part.shard, host_grads + layout.offset(id), layout.num_elements(id));
//
// The flat array holds the map's tensors back to back in map order; a chunk
// covers elements [tensor_offset + chunk.offset, + chunk.num_elements).
//
// Thread safety: immutable once built; any thread may read it.
#ifndef GRPS_WORKER_CHUNK_LAYOUT_H_
#define GRPS_WORKER_CHUNK_LAYOUT_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/grps.pb.h"

namespace grps {

// How a newer shard map fits the layout of a client's map: the same chunks
// on the same shards (only endpoints may differ: UpdateShardMap follows
// it), or the same tensors and chunks placed on other shards, or on
// another number of them (a re-sharding, JobConfig.max_servers: clients
// built for the new map follow it, at the roll-back that comes with it).
enum class MapFit { kSameLayout, kReplaced };

// INVALID_ARGUMENT for a map that fails ValidateShardMap, holds other
// tensors or cuts them into other chunks (another model), or lacks an
// endpoint (or its address) for one of its shards.
absl::StatusOr<MapFit> FitShardMap(const v1::ShardMap& layout, const v1::ShardMap& map);

class ChunkLayout {
 public:
  // A part's payload: chunks are added to a part up to this many bytes (the
  // job's default chunk is 256 KiB: a part each). A part takes 10 ms on a
  // 200 Mbit/s link, 0.2 ms at 10 Gbit/s: about the step's tail that cannot
  // overlap. (Across 200 Mbit/s namespace hosts, parts of 4 MiB, 1 MiB and
  // 256 KiB gave 37.5, 45.1 and 47.8 samples/s: docs/performance.md.)
  static constexpr size_t kPartBytes = size_t{256} << 10;
  // The same to a shard on the worker's own machine, where a request costs
  // more than its bytes: a 64 MiB push then pull over loopback gRPC went
  // from 0.55-0.67 of TCP's rate to 0.78-0.92 with parts of 4 MiB
  // (docs/performance.md, "Parts by the link").
  static constexpr size_t kLocalPartBytes = size_t{4} << 20;
  // JobConfig.part_bytes, or when it is 0 the part size to shard `shard` of
  // `map` by where its endpoint is: kLocalPartBytes at an address of this
  // machine (IsThisMachinesAddress), kPartBytes elsewhere.
  static std::vector<size_t> PartBytesFor(const v1::JobConfig& config, const v1::ShardMap& map);
  // By shard of `map`: whether its endpoint is at an address of this
  // machine (IsThisMachinesAddress).
  static std::vector<bool> OnThisMachine(const v1::ShardMap& map);

  // The chunks of one request: all of one shard's, or a run of them.
  struct Part {
    size_t shard = 0;
    std::vector<uint32_t> chunk_ids;
  };

  // `map` must be valid (ValidateShardMap). Its endpoints are kept as they
  // are: map() is for its tensors, chunks and number of shards. Parts to
  // shard s carry at most part_bytes[s] (empty: kPartBytes to every shard).
  explicit ChunkLayout(const v1::ShardMap& map, std::vector<size_t> part_bytes = {});

  const v1::ShardMap& map() const { return map_; }
  int64_t num_parameters() const { return num_params_; }
  size_t num_shards() const { return static_cast<size_t>(map_.shards_size()); }
  size_t num_chunks() const { return chunk_offset_.size(); }
  size_t num_tensors() const { return tensor_chunks_.size(); }
  // Where chunk `id`'s values start in the flat array, and how many.
  int64_t offset(uint32_t id) const { return chunk_offset_[id]; }
  uint64_t num_elements(uint32_t id) const { return map_.chunks(static_cast<int>(id)).num_elements(); }
  // Chunk ids by tensor, in the map's order.
  const std::vector<uint32_t>& tensor_chunks(size_t tensor) const { return tensor_chunks_[tensor]; }

  // Every chunk in exactly one part: each shard's chunks in runs of at most
  // its part bytes of f32 (the widest wire dtype; a larger chunk alone); then
  // every part in the model's order (its first chunk's), so the shards take
  // turns and every worker sends the same part first.
  const std::vector<Part>& parts() const { return parts_; }
  // The values of parts()[part], in f32 (the widest wire dtype).
  size_t part_bytes(size_t part) const;
  // By shard: the values of its largest part, in f32.
  std::vector<size_t> LargestPartBytes() const;
  // The index in parts() of the part that holds chunk `id`.
  size_t part_of(uint32_t id) const { return part_of_chunk_[id]; }
  // Indices into parts() in the order backward makes them ready: by the
  // tensor of a part's first chunk (the earliest of its tensors, the last
  // backward reaches), last tensor first; a tensor's parts in the model's
  // order. (Each tensor's parts in reverse cost 15 % of a sync step at 4
  // workers across hosts: docs/performance.md, "TCP congestion control".)
  std::vector<size_t> BackwardOrder() const;

  // Each shard's chunks in runs of at most `max_bytes` of `slots` f32 values
  // per element (at least one), shard by shard.
  std::vector<Part> Runs(uint32_t slots, size_t max_bytes) const;

 private:
  const v1::ShardMap map_;
  int64_t num_params_ = 0;
  std::vector<int64_t> chunk_offset_;                 // by chunk id
  std::vector<Part> parts_;
  std::vector<uint32_t> part_of_chunk_;               // index into parts_
  std::vector<std::vector<uint32_t>> tensor_chunks_;  // chunk ids by tensor
};

}  // namespace grps

#endif  // GRPS_WORKER_CHUNK_LAYOUT_H_
