// ChunkLayout and FitShardMap: the flat array's chunks, their parts, and
// whether a newer map keeps them.
#include "worker/chunk_layout.h"

#include <algorithm>
#include <numeric>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "daemon/daemon.h"
#include "job/shard_map.h"

namespace grps {
namespace {

// The same piece of the same tensor, wherever it is placed.
bool SameChunk(const v1::ChunkSpec& a, const v1::ChunkSpec& b) {
  return a.chunk_id() == b.chunk_id() && a.tensor_index() == b.tensor_index() &&
         a.offset() == b.offset() && a.num_elements() == b.num_elements();
}

bool SameTensor(const v1::TensorSpec& a, const v1::TensorSpec& b) {
  return a.name() == b.name() &&
         std::equal(a.shape().begin(), a.shape().end(), b.shape().begin(),
                    b.shape().end());
}

}  // namespace

absl::StatusOr<MapFit> FitShardMap(const v1::ShardMap& layout, const v1::ShardMap& map) {
  if (absl::Status s = ValidateShardMap(map); !s.ok())
    return absl::InvalidArgumentError(
        absl::StrCat("shard map epoch ", map.epoch(), ": ", s.message()));
  if (map.tensors_size() != layout.tensors_size() || map.chunks_size() != layout.chunks_size())
    return absl::InvalidArgumentError(absl::StrCat(
        "shard map epoch ", map.epoch(), " has ", map.tensors_size(), " tensors and ",
        map.chunks_size(), " chunks; the job's map has ", layout.tensors_size(), " and ",
        layout.chunks_size()));
  for (int i = 0; i < map.tensors_size(); ++i)
    if (!SameTensor(map.tensors(i), layout.tensors(i)))
      return absl::InvalidArgumentError(absl::StrCat(
          "shard map epoch ", map.epoch(), ": tensor ", i, " differs"));
  for (int i = 0; i < map.chunks_size(); ++i)
    if (!SameChunk(map.chunks(i), layout.chunks(i)))
      return absl::InvalidArgumentError(absl::StrCat(
          "shard map epoch ", map.epoch(), ": chunk ", i, " is cut differently"));
  std::vector<bool> seen(map.shards_size(), false);
  for (const v1::ShardEndpoint& e : map.shards()) {
    if (e.shard() >= seen.size() || seen[e.shard()])
      return absl::InvalidArgumentError(absl::StrCat(
          "shard map epoch ", map.epoch(), ": bad or repeated endpoint of shard ",
          e.shard()));
    seen[e.shard()] = true;
    if (e.address().empty())
      return absl::InvalidArgumentError(absl::StrCat(
          "shard map epoch ", map.epoch(), " has no address for shard ", e.shard()));
  }
  if (map.shards_size() != layout.shards_size()) return MapFit::kReplaced;
  for (int i = 0; i < map.chunks_size(); ++i)
    if (map.chunks(i).shard() != layout.chunks(i).shard()) return MapFit::kReplaced;
  return MapFit::kSameLayout;
}

std::vector<size_t> ChunkLayout::PartBytesFor(const v1::JobConfig& config,
                                              const v1::ShardMap& map) {
  if (config.part_bytes() != 0) return std::vector<size_t>(map.shards_size(), config.part_bytes());
  const std::vector<bool> local = OnThisMachine(map);
  std::vector<size_t> bytes(map.shards_size());
  for (size_t s = 0; s < bytes.size(); ++s) bytes[s] = local[s] ? kLocalPartBytes : kPartBytes;
  return bytes;
}

std::vector<bool> ChunkLayout::OnThisMachine(const v1::ShardMap& map) {
  std::vector<bool> local(map.shards_size(), false);
  for (const v1::ShardEndpoint& e : map.shards())
    if (e.shard() < local.size() && IsThisMachinesAddress(e.address())) local[e.shard()] = true;
  return local;
}

ChunkLayout::ChunkLayout(const v1::ShardMap& map, std::vector<size_t> part_bytes) : map_(map) {
  part_bytes.resize(map_.shards_size(), kPartBytes);
  std::vector<int64_t> tensor_offset;
  for (const v1::TensorSpec& t : map_.tensors()) {
    tensor_offset.push_back(num_params_);
    num_params_ += NumElements(t);
  }
  for (const v1::ChunkSpec& c : map_.chunks())
    chunk_offset_.push_back(tensor_offset[c.tensor_index()] + c.offset());
  std::vector<std::vector<uint32_t>> shard_chunks(map_.shards_size());
  for (const v1::ChunkSpec& c : map_.chunks())
    shard_chunks[c.shard()].push_back(c.chunk_id());
  for (size_t shard = 0; shard < shard_chunks.size(); ++shard) {
    size_t bytes = 0;
    for (uint32_t id : shard_chunks[shard]) {
      const size_t chunk_bytes = num_elements(id) * sizeof(float);
      if (parts_.empty() || parts_.back().shard != shard ||
          bytes + chunk_bytes > part_bytes[shard]) {
        parts_.push_back(Part{shard, {}});
        bytes = 0;
      }
      parts_.back().chunk_ids.push_back(id);
      bytes += chunk_bytes;
    }
  }
  std::stable_sort(parts_.begin(), parts_.end(), [](const Part& a, const Part& b) {
    return a.chunk_ids.front() < b.chunk_ids.front();
  });
  part_of_chunk_.assign(map_.chunks_size(), 0);
  for (size_t i = 0; i < parts_.size(); ++i)
    for (uint32_t id : parts_[i].chunk_ids) part_of_chunk_[id] = static_cast<uint32_t>(i);
  tensor_chunks_.resize(map_.tensors_size());
  for (const v1::ChunkSpec& c : map_.chunks())
    tensor_chunks_[c.tensor_index()].push_back(c.chunk_id());
}

size_t ChunkLayout::part_bytes(size_t part) const {
  size_t bytes = 0;
  for (uint32_t id : parts_[part].chunk_ids) bytes += num_elements(id) * sizeof(float);
  return bytes;
}

std::vector<size_t> ChunkLayout::LargestPartBytes() const {
  std::vector<size_t> largest(num_shards(), 0);
  for (size_t p = 0; p < parts_.size(); ++p)
    largest[parts_[p].shard] = std::max(largest[parts_[p].shard], part_bytes(p));
  return largest;
}

std::vector<ChunkLayout::Part> ChunkLayout::Runs(uint32_t slots, size_t max_bytes) const {
  std::vector<std::vector<uint32_t>> by_shard(map_.shards_size());
  for (const v1::ChunkSpec& c : map_.chunks()) by_shard[c.shard()].push_back(c.chunk_id());
  std::vector<Part> runs;
  for (size_t shard = 0; shard < by_shard.size(); ++shard) {
    size_t bytes = 0;
    for (uint32_t id : by_shard[shard]) {
      const size_t chunk_bytes = num_elements(id) * sizeof(float) * std::max<uint32_t>(slots, 1);
      if (runs.empty() || runs.back().shard != shard || bytes + chunk_bytes > max_bytes) {
        runs.push_back(Part{shard, {}});
        bytes = 0;
      }
      runs.back().chunk_ids.push_back(id);
      bytes += chunk_bytes;
    }
  }
  return runs;
}

std::vector<size_t> ChunkLayout::BackwardOrder() const {
  std::vector<size_t> order(parts_.size());
  std::iota(order.begin(), order.end(), size_t{0});
  auto tensor = [&](size_t part) {
    return map_.chunks(static_cast<int>(parts_[part].chunk_ids.front())).tensor_index();
  };
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return tensor(a) > tensor(b); });
  return order;
}

}  // namespace grps
