// SplitMix64 (Steele, Lea, Flood 2014): one step of its state from `x`, then
// its finalizer. Bijective on 64 bits, and every input bit flips about half
// of the output bits. grps keys on it what must never change once a job has
// stored values: initial values by element index (job/initializer.cc), a
// sparse row's shard and initial values (job/sparse_tables.cc) and a hashed
// feature's row (worker/sparse_batch.cc); and a data order: an epoch's
// shuffle key (data/epoch_shuffler.cc) and the synthetic sparse data's
// streams (data/synthetic_sparse.cc). The one definition: here, in the
// lowest folder that uses it.
#ifndef GRPS_DATA_SPLIT_MIX_H_
#define GRPS_DATA_SPLIT_MIX_H_

#include <cstdint>

namespace grps {

inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace grps

#endif  // GRPS_DATA_SPLIT_MIX_H_
