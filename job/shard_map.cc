#include "job/shard_map.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace grps {

int64_t NumElements(const v1::TensorSpec& tensor) {
  int64_t n = 1;
  for (int64_t d : tensor.shape()) n *= d;
  return n;
}

std::optional<uint64_t> CheckedNumElements(const v1::TensorSpec& tensor) {
  int64_t n = 1;
  for (int64_t d : tensor.shape())
    if (d < 1 || __builtin_mul_overflow(n, d, &n)) return std::nullopt;
  return static_cast<uint64_t>(n);
}

namespace {

// Elements of one chunk at most.
uint64_t MaxChunkElements(uint64_t chunk_bytes) {
  return std::max<uint64_t>(1, chunk_bytes / sizeof(float));
}

}  // namespace

uint64_t ChunksOfTensor(uint64_t elements, uint64_t chunk_bytes) {
  const uint64_t max_elems = MaxChunkElements(chunk_bytes);
  return elements / max_elems + (elements % max_elems != 0 ? 1 : 0);
}

absl::StatusOr<v1::ShardMap> BuildShardMap(
    const std::vector<v1::TensorSpec>& tensors, uint32_t num_shards,
    uint64_t chunk_bytes) {
  if (num_shards == 0) return absl::InvalidArgumentError("no shards");
  v1::ShardMap map;
  std::vector<uint64_t> elements;
  for (const v1::TensorSpec& t : tensors) {
    std::optional<uint64_t> n = CheckedNumElements(t);
    if (!n.has_value())
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor ", t.name(), " has a dimension below 1 or more than 2^63 - 1 elements"));
    elements.push_back(*n);
    *map.add_tensors() = t;
  }
  for (int ti = 0; ti < map.tensors_size(); ++ti) {
    const uint64_t n = elements[ti];  // >= 1: every dim is
    const uint64_t pieces = ChunksOfTensor(n, chunk_bytes);
    const uint64_t base = n / pieces, extra = n % pieces;
    uint64_t offset = 0;
    for (uint64_t p = 0; p < pieces; ++p) {
      const uint64_t len = base + (p < extra ? 1 : 0);
      v1::ChunkSpec* c = map.add_chunks();
      c->set_chunk_id(map.chunks_size() - 1);
      c->set_tensor_index(ti);
      c->set_offset(offset);
      c->set_num_elements(len);
      offset += len;
    }
  }
  std::vector<int> order(map.chunks_size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return map.chunks(a).num_elements() > map.chunks(b).num_elements();
  });
  std::vector<uint64_t> load(num_shards, 0);
  for (int i : order) {
    uint32_t best = static_cast<uint32_t>(
        std::min_element(load.begin(), load.end()) - load.begin());
    map.mutable_chunks(i)->set_shard(best);
    load[best] += map.chunks(i).num_elements() * sizeof(float);
  }
  for (uint32_t s = 0; s < num_shards; ++s) map.add_shards()->set_shard(s);
  return map;
}

absl::Status ValidateShardMap(const v1::ShardMap& map) {
  auto bad = [](auto... parts) {
    return absl::InvalidArgumentError(absl::StrCat("shard map: ", parts...));
  };
  const uint32_t num_shards = map.shards_size();
  if (num_shards == 0) return bad("no shards");
  std::vector<uint64_t> elements(map.tensors_size());
  for (int t = 0; t < map.tensors_size(); ++t) {
    std::optional<uint64_t> n = CheckedNumElements(map.tensors(t));
    if (!n.has_value())
      return bad("tensor ", t, " has a dimension below 1 or more than 2^63 - 1 elements");
    elements[t] = *n;
  }
  std::vector<uint64_t> next_offset(map.tensors_size(), 0);
  for (int i = 0; i < map.chunks_size(); ++i) {
    const v1::ChunkSpec& c = map.chunks(i);
    if (c.chunk_id() != static_cast<uint32_t>(i)) return bad("chunk ids not dense");
    if (c.tensor_index() >= static_cast<uint32_t>(map.tensors_size()))
      return bad("chunk ", i, " names an unknown tensor");
    if (c.shard() >= num_shards) return bad("chunk ", i, " names an unknown shard");
    if (c.num_elements() == 0) return bad("chunk ", i, " is empty");
    if (c.offset() != next_offset[c.tensor_index()])
      return bad("chunk ", i, " does not follow its predecessor");
    // Compared with what is left of the tensor, so that the sum cannot wrap.
    if (c.num_elements() > elements[c.tensor_index()] - next_offset[c.tensor_index()])
      return bad("chunk ", i, " runs past the end of its tensor");
    next_offset[c.tensor_index()] += c.num_elements();
  }
  for (int t = 0; t < map.tensors_size(); ++t)
    if (next_offset[t] != elements[t])
      return bad("chunks do not cover tensor ", map.tensors(t).name());
  for (uint32_t s = 0; s < num_shards; ++s)
    if (map.shards(s).shard() != s) return bad("shard endpoints out of order");
  return absl::OkStatus();
}

std::vector<uint32_t> ChunksOfShard(const v1::ShardMap& map, uint32_t shard) {
  std::vector<uint32_t> ids;
  for (const v1::ChunkSpec& c : map.chunks())
    if (c.shard() == shard) ids.push_back(c.chunk_id());
  return ids;
}

std::vector<uint64_t> BytesPerShard(const v1::ShardMap& map) {
  std::vector<uint64_t> bytes(map.shards_size(), 0);
  for (const v1::ChunkSpec& c : map.chunks())
    if (c.shard() < bytes.size()) bytes[c.shard()] += c.num_elements() * sizeof(float);
  return bytes;
}

}  // namespace grps
