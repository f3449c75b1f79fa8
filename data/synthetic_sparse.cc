#include "data/synthetic_sparse.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "data/split_mix.h"

namespace grps {
namespace {

// The random streams, each seeded from the options' seed.
enum class Stream : uint64_t { kGroundTruth = 0, kTrain = 1, kTest = 2 };

// Spreads (seed, stream) over a whole 64-bit seed, so that nearby seeds and
// streams give unrelated generators: SplitMix64 of the stream's step of its
// state from the seed.
uint64_t StreamSeed(uint64_t seed, Stream stream) {
  return SplitMix64(seed + static_cast<uint64_t>(stream) * 0x9e3779b97f4a7c15ULL);
}

// mt19937_64 with distributions of our own, so that a seed gives the same
// draws with any standard library (std::uniform_*_distribution and
// std::normal_distribution are implementation-defined).
class Random {
 public:
  static constexpr double kTwoPi = 6.283185307179586;

  explicit Random(uint64_t seed) : engine_(seed) {}

  // Uniform in [0, n), n >= 1, without modulo bias.
  uint64_t UniformInt(uint64_t n) {
    const uint64_t max = std::numeric_limits<uint64_t>::max();
    const uint64_t limit = max - max % n;  // a multiple of n (or max)
    uint64_t x;
    do {
      x = engine_();
    } while (x >= limit && limit != max);
    return x % n;
  }
  // Uniform in [0, 1), 53 random bits.
  double Uniform() { return static_cast<double>(engine_() >> 11) * 0x1p-53; }
  // N(0, 1) by Box-Muller (one of the pair).
  double Normal() {
    const double u1 = 1.0 - Uniform();  // (0, 1]: log is finite
    const double u2 = Uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(kTwoPi * u2);
  }

 private:
  std::mt19937_64 engine_;
};

// Draws ranks 0..n-1 with integer weights, without replacement within one
// example: Draw takes a rank out until Restore puts every taken one back.
// A Fenwick tree keeps both O(log n); integer weights keep the removals and
// restores exact.
class RankSampler {
 public:
  explicit RankSampler(std::vector<uint64_t> weights)
      : weights_(std::move(weights)), tree_(weights_.size() + 1, 0) {
    const size_t n = weights_.size();
    for (size_t i = 1; i <= n; ++i) {
      tree_[i] += weights_[i - 1];
      const size_t parent = i + (i & (~i + 1));
      if (parent <= n) tree_[parent] += tree_[i];
    }
    top_bit_ = 1;
    while (top_bit_ * 2 <= n) top_bit_ *= 2;
  }

  // A rank not taken since the last Restore; requires one to be left.
  int64_t Draw(Random& random) {
    uint64_t u = random.UniformInt(Total());
    size_t pos = 0;
    for (size_t step = top_bit_; step > 0; step >>= 1) {
      if (pos + step < tree_.size() && tree_[pos + step] <= u) {
        pos += step;
        u -= tree_[pos];
      }
    }
    Add(pos, -weights_[pos]);  // unsigned wrap-around subtracts
    taken_.push_back(pos);
    return static_cast<int64_t>(pos);
  }

  void Restore() {
    for (size_t rank : taken_) Add(rank, weights_[rank]);
    taken_.clear();
  }

 private:
  uint64_t Total() const {
    uint64_t sum = 0;
    for (size_t i = tree_.size() - 1; i > 0; i -= i & (~i + 1)) sum += tree_[i];
    return sum;
  }
  void Add(size_t rank, uint64_t delta) {
    for (size_t i = rank + 1; i < tree_.size(); i += i & (~i + 1)) {
      tree_[i] += delta;
    }
  }

  std::vector<uint64_t> weights_;
  std::vector<uint64_t> tree_;  // 1-based
  size_t top_bit_ = 1;
  std::vector<size_t> taken_;
};

// Frequencies proportional to 1 / (rank + 1)^s as integers: the hottest
// 2^62 / n, so that the total stays below 2^62, none below 1.
std::vector<uint64_t> ZipfWeights(int64_t n, double s) {
  const double top = std::ldexp(1.0, 62) / static_cast<double>(n);
  std::vector<uint64_t> weights(n);
  for (int64_t r = 0; r < n; ++r) {
    const double w = top / std::pow(static_cast<double>(r + 1), s);
    weights[r] = std::max<uint64_t>(1, static_cast<uint64_t>(w));
  }
  return weights;
}

struct GroundTruth {
  std::vector<int64_t> id_of_rank;
  std::vector<float> weights;  // vocabulary x num_classes
};

GroundTruth MakeGroundTruth(const SyntheticSparseOptions& options) {
  Random random(StreamSeed(options.seed, Stream::kGroundTruth));
  GroundTruth truth;
  truth.weights.resize(options.vocabulary * options.num_classes);
  for (float& w : truth.weights) w = static_cast<float>(random.Normal());
  truth.id_of_rank.resize(options.vocabulary);
  for (int64_t r = 0; r < options.vocabulary; ++r) truth.id_of_rank[r] = r;
  for (int64_t r = options.vocabulary - 1; r > 0; --r) {
    std::swap(truth.id_of_rank[r], truth.id_of_rank[random.UniformInt(r + 1)]);
  }
  return truth;
}

// Redraws of one example whose margin is too small before giving up.
constexpr int64_t kMaxDrawsPerExample = 10000;

// `count` examples from `stream`; *clean_kept counts the labels the noise
// left at the clean argmax.
absl::StatusOr<SparseDataset> GenerateSet(
    const SyntheticSparseOptions& options, const GroundTruth& truth,
    RankSampler& sampler, int64_t count, Stream stream, int64_t* clean_kept) {
  Random random(StreamSeed(options.seed, stream));
  const int32_t k = options.features_per_example;
  const int32_t classes = options.num_classes;
  std::vector<int64_t> offsets{0};
  std::vector<int64_t> ids;
  std::vector<float> values;
  std::vector<int32_t> labels;
  offsets.reserve(count + 1);
  ids.reserve(count * k);
  values.reserve(count * k);
  labels.reserve(count);
  std::vector<double> scores(classes);
  const double min_margin = options.margin * std::sqrt(static_cast<double>(k));
  *clean_kept = 0;
  for (int64_t i = 0; i < count; ++i) {
    const size_t first = ids.size();
    int32_t clean = 0;
    for (int64_t attempt = 1;; ++attempt) {
      for (int32_t j = 0; j < k; ++j) {
        ids.push_back(truth.id_of_rank[sampler.Draw(random)]);
      }
      sampler.Restore();
      std::sort(ids.begin() + first, ids.end());
      std::fill(scores.begin(), scores.end(), 0.0);
      for (size_t e = first; e < ids.size(); ++e) {
        const float value =
            options.unit_values ? 1.0f
                                : static_cast<float>(0.5 + random.Uniform());
        values.push_back(value);
        const float* w = &truth.weights[ids[e] * classes];
        for (int32_t c = 0; c < classes; ++c) scores[c] += value * w[c];
      }
      clean = static_cast<int32_t>(
          std::max_element(scores.begin(), scores.end()) - scores.begin());
      double second = -std::numeric_limits<double>::infinity();
      for (int32_t c = 0; c < classes; ++c) {
        if (c != clean) second = std::max(second, scores[c]);
      }
      if (scores[clean] - second >= min_margin) break;
      ids.resize(first);
      values.resize(first);
      if (attempt == kMaxDrawsPerExample) {
        return absl::InvalidArgumentError(absl::StrCat(
            "SyntheticSparseOptions.margin ", options.margin, " is too large: ",
            kMaxDrawsPerExample, " examples in a row fell within it"));
      }
    }
    int32_t label = clean;
    if (random.Uniform() < options.label_noise) {
      label = static_cast<int32_t>(random.UniformInt(classes));
    }
    *clean_kept += label == clean;
    labels.push_back(label);
    offsets.push_back(static_cast<int64_t>(ids.size()));
  }
  return SparseDataset::Create(classes, options.vocabulary, std::move(offsets),
                               std::move(ids), std::move(values),
                               std::move(labels));
}

absl::Status Validate(const SyntheticSparseOptions& o) {
  auto refuse = [](const char* option, const std::string& rule,
                   const auto& got) {
    return absl::InvalidArgumentError(absl::StrCat(
        "SyntheticSparseOptions.", option, " must be ", rule, ", got ", got));
  };
  if (o.num_train < 1) return refuse("num_train", ">= 1", o.num_train);
  if (o.num_test < 1) return refuse("num_test", ">= 1", o.num_test);
  if (o.num_classes < 2) return refuse("num_classes", ">= 2", o.num_classes);
  if (o.vocabulary < 1 ||
      o.vocabulary > (int64_t{1} << 28) / o.num_classes) {
    return refuse("vocabulary",
                  absl::StrCat("in [1, 2^28 / num_classes = ",
                               (int64_t{1} << 28) / o.num_classes, "]"),
                  o.vocabulary);
  }
  if (o.features_per_example < 1 || o.features_per_example > o.vocabulary) {
    return refuse("features_per_example",
                  absl::StrCat("in [1, vocabulary = ", o.vocabulary, "]"),
                  o.features_per_example);
  }
  constexpr int64_t kMaxIdsPerSet = int64_t{1} << 30;
  if (o.num_train > kMaxIdsPerSet / o.features_per_example) {
    return refuse("num_train", "at most 2^30 / features_per_example",
                  o.num_train);
  }
  if (o.num_test > kMaxIdsPerSet / o.features_per_example) {
    return refuse("num_test", "at most 2^30 / features_per_example",
                  o.num_test);
  }
  if (!(o.zipf_exponent >= 0 && o.zipf_exponent <= 4)) {
    return refuse("zipf_exponent", "in [0, 4]", o.zipf_exponent);
  }
  if (!(o.margin >= 0 && o.margin <= 10)) {
    return refuse("margin", "in [0, 10]", o.margin);
  }
  if (!(o.label_noise >= 0 && o.label_noise < 1)) {
    return refuse("label_noise", "in [0, 1)", o.label_noise);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SyntheticSparse> GenerateSyntheticSparse(
    const SyntheticSparseOptions& options) {
  if (absl::Status status = Validate(options); !status.ok()) return status;
  GroundTruth truth = MakeGroundTruth(options);
  RankSampler sampler(ZipfWeights(options.vocabulary, options.zipf_exponent));

  SyntheticSparse out;
  int64_t kept = 0;
  absl::StatusOr<SparseDataset> train = GenerateSet(
      options, truth, sampler, options.num_train, Stream::kTrain, &kept);
  if (!train.ok()) return train.status();
  absl::StatusOr<SparseDataset> test = GenerateSet(
      options, truth, sampler, options.num_test, Stream::kTest, &kept);
  if (!test.ok()) return test.status();
  out.train = *std::move(train);
  out.test = *std::move(test);
  out.weights = std::move(truth.weights);
  const double eps = options.label_noise;
  out.bayes_accuracy = 1.0 - eps + eps / options.num_classes;
  out.ground_truth_test_accuracy =
      static_cast<double>(kept) / static_cast<double>(options.num_test);
  return out;
}

}  // namespace grps
