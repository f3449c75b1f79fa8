// A small shard map for the worker's tests: one tensor cut into equal chunks
// dealt over the shards in turn. For tests only.
#ifndef GRPS_WORKER_TESTING_DEALT_MAP_H_
#define GRPS_WORKER_TESTING_DEALT_MAP_H_

#include <cstdint>

#include "proto/grps.pb.h"

namespace grps {

// Tensor "w" of `chunks` chunks of `chunk_floats` floats; chunk i (at
// offset i * chunk_floats) on shard i % `shards`.
inline v1::ShardMap DealtMap(uint32_t chunks, uint32_t chunk_floats, uint32_t shards) {
  v1::ShardMap map;
  v1::TensorSpec* t = map.add_tensors();
  t->set_name("w");
  t->add_shape(static_cast<int64_t>(chunks) * chunk_floats);
  for (uint32_t id = 0; id < chunks; ++id) {
    v1::ChunkSpec* c = map.add_chunks();
    c->set_chunk_id(id);
    c->set_offset(static_cast<uint64_t>(id) * chunk_floats);
    c->set_num_elements(chunk_floats);
    c->set_shard(id % shards);
  }
  for (uint32_t s = 0; s < shards; ++s) map.add_shards()->set_shard(s);
  return map;
}

}  // namespace grps

#endif  // GRPS_WORKER_TESTING_DEALT_MAP_H_
