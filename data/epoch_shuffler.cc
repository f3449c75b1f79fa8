#include "data/epoch_shuffler.h"

#include <random>
#include <utility>

#include "data/split_mix.h"

namespace grps {
namespace {

// Unbiased draw from [0, m), m >= 1, by rejection (see the header).
uint64_t UniformBelow(std::mt19937_64& engine, uint64_t m) {
  const uint64_t threshold = (0 - m) % m;  // (2^64 - m) mod m
  uint64_t x;
  do {
    x = engine();
  } while (x < threshold);
  return x % m;
}

}  // namespace

std::vector<int64_t> EpochShuffler::Order(uint64_t epoch) const {
  const int64_t n = range_.size() > 0 ? range_.size() : 0;
  std::vector<int64_t> order(n);
  for (int64_t k = 0; k < n; ++k) order[k] = k;
  std::mt19937_64 engine(SplitMix64(SplitMix64(seed_) ^ epoch));
  for (int64_t i = n - 1; i >= 1; --i) {
    const int64_t j =
        static_cast<int64_t>(UniformBelow(engine, static_cast<uint64_t>(i) + 1));
    std::swap(order[i], order[j]);
  }
  for (int64_t& index : order) index += range_.begin;
  return order;
}

}  // namespace grps
