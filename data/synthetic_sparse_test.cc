#include "data/synthetic_sparse.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <limits>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace grps {
namespace {

using ::testing::HasSubstr;

SyntheticSparseOptions Small() {
  SyntheticSparseOptions options;
  options.num_train = 2000;
  options.num_test = 500;
  options.vocabulary = 300;
  options.features_per_example = 5;
  options.num_classes = 3;
  options.label_noise = 0.2;
  options.seed = 7;
  return options;
}

void ExpectSame(const SparseDataset& a, const SparseDataset& b) {
  EXPECT_EQ(a.offsets(), b.offsets());
  EXPECT_EQ(a.all_ids(), b.all_ids());
  EXPECT_EQ(a.all_values(), b.all_values());
  EXPECT_EQ(a.labels(), b.labels());
}

// The ground truth's scores of example i: sum value * W[id].
std::vector<double> Scores(const SyntheticSparse& data,
                           const SparseDataset& set, int64_t i) {
  const int32_t classes = set.num_classes();
  std::vector<double> scores(classes, 0.0);
  for (size_t e = 0; e < set.ids(i).size(); ++e) {
    for (int32_t c = 0; c < classes; ++c) {
      scores[c] += set.values(i)[e] * data.weights[set.ids(i)[e] * classes + c];
    }
  }
  return scores;
}

int32_t CleanLabel(const SyntheticSparse& data, const SparseDataset& set,
                   int64_t i) {
  const std::vector<double> scores = Scores(data, set, i);
  return static_cast<int32_t>(std::max_element(scores.begin(), scores.end()) -
                              scores.begin());
}

TEST(SyntheticSparseTest, MakesTheAskedShape) {
  const SyntheticSparseOptions options = Small();
  absl::StatusOr<SyntheticSparse> data = GenerateSyntheticSparse(options);
  ASSERT_TRUE(data.ok()) << data.status();
  for (const SparseDataset* set : {&data->train, &data->test}) {
    EXPECT_EQ(set->num_classes(), 3);
    EXPECT_EQ(set->feature_space(), 300u);
    for (int64_t i = 0; i < set->num_examples(); ++i) {
      // Create already checked that ids ascend strictly, so are distinct.
      ASSERT_EQ(set->ids(i).size(), 5u);
      for (float v : set->values(i)) ASSERT_EQ(v, 1.0f);
    }
  }
  EXPECT_EQ(data->train.num_examples(), 2000);
  EXPECT_EQ(data->test.num_examples(), 500);
  EXPECT_EQ(data->weights.size(), 300u * 3);
}

TEST(SyntheticSparseTest, SameSeedSameDataOtherSeedOtherData) {
  absl::StatusOr<SyntheticSparse> a = GenerateSyntheticSparse(Small());
  absl::StatusOr<SyntheticSparse> b = GenerateSyntheticSparse(Small());
  ASSERT_TRUE(a.ok() && b.ok());
  ExpectSame(a->train, b->train);
  ExpectSame(a->test, b->test);
  EXPECT_EQ(a->weights, b->weights);
  EXPECT_EQ(a->ground_truth_test_accuracy, b->ground_truth_test_accuracy);

  SyntheticSparseOptions other = Small();
  other.seed = 8;
  absl::StatusOr<SyntheticSparse> c = GenerateSyntheticSparse(other);
  ASSERT_TRUE(c.ok());
  EXPECT_NE(a->train.all_ids(), c->train.all_ids());
  EXPECT_NE(a->weights, c->weights);
}

TEST(SyntheticSparseTest, TrainAndTestComeFromIndependentStreams) {
  SyntheticSparseOptions more_test = Small();
  more_test.num_test = 900;
  SyntheticSparseOptions more_train = Small();
  more_train.num_train = 3000;
  absl::StatusOr<SyntheticSparse> base = GenerateSyntheticSparse(Small());
  absl::StatusOr<SyntheticSparse> a = GenerateSyntheticSparse(more_test);
  absl::StatusOr<SyntheticSparse> b = GenerateSyntheticSparse(more_train);
  ASSERT_TRUE(base.ok() && a.ok() && b.ok());
  ExpectSame(base->train, a->train);  // a bigger test set, the same train
  ExpectSame(base->test, b->test);    // a bigger train set, the same test
  // ... and the extra examples extend the smaller set.
  absl::StatusOr<SparseDataset> head = a->test.Subset(0, 500);
  ASSERT_TRUE(head.ok());
  ExpectSame(base->test, *head);
  // The two sets are not the same stream.
  absl::StatusOr<SparseDataset> train_head = base->train.Subset(0, 500);
  ASSERT_TRUE(train_head.ok());
  EXPECT_NE(train_head->all_ids(), base->test.all_ids());
}

TEST(SyntheticSparseTest, WithoutNoiseEveryLabelIsTheGroundTruthsArgmax) {
  SyntheticSparseOptions options = Small();
  options.label_noise = 0;
  options.unit_values = false;
  absl::StatusOr<SyntheticSparse> data = GenerateSyntheticSparse(options);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->bayes_accuracy, 1.0);
  EXPECT_EQ(data->ground_truth_test_accuracy, 1.0);
  for (const SparseDataset* set : {&data->train, &data->test}) {
    for (int64_t i = 0; i < set->num_examples(); ++i) {
      ASSERT_EQ(set->label(i), CleanLabel(*data, *set, i)) << i;
      for (float v : set->values(i)) {
        ASSERT_GE(v, 0.5f);
        ASSERT_LT(v, 1.5f);
      }
    }
  }
}

TEST(SyntheticSparseTest, EveryExampleClearsTheMargin) {
  SyntheticSparseOptions options = Small();
  options.margin = 0.5;
  absl::StatusOr<SyntheticSparse> data = GenerateSyntheticSparse(options);
  ASSERT_TRUE(data.ok()) << data.status();
  const double min_margin = 0.5 * std::sqrt(5.0);
  double smallest = std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < data->train.num_examples(); ++i) {
    std::vector<double> scores = Scores(*data, data->train, i);
    std::sort(scores.begin(), scores.end());
    smallest = std::min(smallest, scores.back() - scores[scores.size() - 2]);
  }
  // float weights summed in double: a hair of rounding either way.
  EXPECT_GE(smallest, min_margin - 1e-5);

  // Without a margin, some examples fall closer than that.
  options.margin = 0;
  data = GenerateSyntheticSparse(options);
  ASSERT_TRUE(data.ok()) << data.status();
  smallest = std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < data->train.num_examples(); ++i) {
    std::vector<double> scores = Scores(*data, data->train, i);
    std::sort(scores.begin(), scores.end());
    smallest = std::min(smallest, scores.back() - scores[scores.size() - 2]);
  }
  EXPECT_LT(smallest, min_margin);
}

TEST(SyntheticSparseTest, MarginNoExampleCanClearIsInvalidArgument) {
  SyntheticSparseOptions options = Small();
  options.vocabulary = 5;
  options.features_per_example = 5;  // one possible example
  options.margin = 10;
  absl::StatusOr<SyntheticSparse> data = GenerateSyntheticSparse(options);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(data.status().message(),
              HasSubstr("SyntheticSparseOptions.margin 10 is too large"));
}

TEST(SyntheticSparseTest, BayesAccuracyIsOneMinusNoisePlusNoiseOverClasses) {
  SyntheticSparseOptions options = Small();
  options.label_noise = 0.3;
  options.num_classes = 5;
  absl::StatusOr<SyntheticSparse> data = GenerateSyntheticSparse(options);
  ASSERT_TRUE(data.ok());
  EXPECT_DOUBLE_EQ(data->bayes_accuracy, 1 - 0.3 + 0.3 / 5);
  SyntheticSparseOptions defaults;
  defaults.num_train = defaults.num_test = 1;
  EXPECT_DOUBLE_EQ(GenerateSyntheticSparse(defaults)->bayes_accuracy, 0.925);
}

TEST(SyntheticSparseTest, GroundTruthAccuracyOnALargeTestSetIsBayes) {
  // 200,000 test labels: the standard error of the accuracy is 0.001, so
  // 0.005 is five of them.
  for (double eps : {0.1, 0.4}) {
    SyntheticSparseOptions options;
    options.num_train = 1;
    options.num_test = 200000;
    options.label_noise = eps;
    absl::StatusOr<SyntheticSparse> data = GenerateSyntheticSparse(options);
    ASSERT_TRUE(data.ok());
    EXPECT_NEAR(data->ground_truth_test_accuracy, data->bayes_accuracy, 0.005)
        << "eps " << eps;
    // And the accuracy it reports is the one the labels show.
    int64_t kept = 0;
    for (int64_t i = 0; i < data->test.num_examples(); ++i) {
      kept += data->test.label(i) == CleanLabel(*data, data->test, i);
    }
    EXPECT_DOUBLE_EQ(data->ground_truth_test_accuracy, kept / 200000.0);
  }
}

TEST(SyntheticSparseTest, ZipfExponentMakesSomeIdsHot) {
  auto counts = [](double exponent) {
    SyntheticSparseOptions options = Small();
    options.num_train = 20000;
    options.zipf_exponent = exponent;
    options.margin = 0;  // the sampler alone (the margin skews frequencies)
    absl::StatusOr<SyntheticSparse> data = GenerateSyntheticSparse(options);
    EXPECT_TRUE(data.ok());
    std::vector<int64_t> count(options.vocabulary, 0);
    for (int64_t id : data->train.all_ids()) ++count[id];
    std::sort(count.begin(), count.end());
    return count;
  };
  // 300 ids, 100,000 draws: uniform gives each about 333.
  const std::vector<int64_t> uniform = counts(0);
  EXPECT_LT(uniform.back(), 2 * uniform.front());
  // Exponent 1 over 300 ids: the hottest is drawn far more often than the
  // coldest (about 300 times as often with replacement; less without).
  const std::vector<int64_t> zipf = counts(1);
  EXPECT_GT(zipf.back(), 20 * std::max<int64_t>(zipf.front(), 1));
  EXPECT_GT(zipf.front(), 0);
}

TEST(SyntheticSparseTest, EveryIdOfASmallVocabularyMayBeInOneExample) {
  SyntheticSparseOptions options = Small();
  options.vocabulary = 6;
  options.features_per_example = 6;
  options.zipf_exponent = 4;
  options.margin = 0;  // the one possible example must do
  absl::StatusOr<SyntheticSparse> data = GenerateSyntheticSparse(options);
  ASSERT_TRUE(data.ok()) << data.status();
  for (int64_t i = 0; i < data->train.num_examples(); ++i) {
    ASSERT_THAT(data->train.ids(i), ::testing::ElementsAre(0, 1, 2, 3, 4, 5));
  }
}

TEST(SyntheticSparseTest, RefusesOptionsOutsideTheirRanges) {
  struct Bad {
    const char* option;
    void (*set)(SyntheticSparseOptions&);
  };
  const std::vector<Bad> bad = {
      {"num_train", [](SyntheticSparseOptions& o) { o.num_train = 0; }},
      {"num_test", [](SyntheticSparseOptions& o) { o.num_test = -1; }},
      {"num_train",  // 10 ids an example
       [](SyntheticSparseOptions& o) { o.num_train = (1 << 30) / 10 + 1; }},
      {"num_classes", [](SyntheticSparseOptions& o) { o.num_classes = 1; }},
      {"vocabulary", [](SyntheticSparseOptions& o) { o.vocabulary = 0; }},
      {"vocabulary",
       [](SyntheticSparseOptions& o) { o.vocabulary = (1 << 28) / 4 + 1; }},
      {"features_per_example",
       [](SyntheticSparseOptions& o) { o.features_per_example = 0; }},
      {"features_per_example",
       [](SyntheticSparseOptions& o) { o.features_per_example = 10001; }},
      {"zipf_exponent",
       [](SyntheticSparseOptions& o) { o.zipf_exponent = -1; }},
      {"zipf_exponent", [](SyntheticSparseOptions& o) { o.zipf_exponent = 5; }},
      {"zipf_exponent",
       [](SyntheticSparseOptions& o) { o.zipf_exponent = std::nan(""); }},
      {"margin", [](SyntheticSparseOptions& o) { o.margin = -0.5; }},
      {"margin", [](SyntheticSparseOptions& o) { o.margin = 11; }},
      {"label_noise", [](SyntheticSparseOptions& o) { o.label_noise = 1; }},
      {"label_noise", [](SyntheticSparseOptions& o) { o.label_noise = -0.1; }},
  };
  for (const Bad& b : bad) {
    SyntheticSparseOptions options;
    b.set(options);
    absl::StatusOr<SyntheticSparse> data = GenerateSyntheticSparse(options);
    EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument)
        << b.option;
    EXPECT_THAT(data.status().message(),
                HasSubstr(std::string("SyntheticSparseOptions.") + b.option));
  }
}

// The model issue 11 trains, at its smallest: an embedding bag (one vector
// of num_classes floats per id, summed over the example's ids, times the
// value) and a bias, under softmax cross-entropy, trained with Adagrad.
// Returns its accuracy on `test`.
double TrainEmbeddingBag(const SparseDataset& train, const SparseDataset& test,
                         int epochs, double learning_rate) {
  const int32_t classes = train.num_classes();
  const uint64_t rows = train.feature_space();
  std::vector<double> embedding(rows * classes, 0.0), e_sq(rows * classes, 0.0);
  std::vector<double> bias(classes, 0.0), b_sq(classes, 0.0);
  std::vector<double> logits(classes), grad(classes);
  auto forward = [&](const SparseDataset& set, int64_t i) {
    for (int32_t c = 0; c < classes; ++c) logits[c] = bias[c];
    for (size_t e = 0; e < set.ids(i).size(); ++e) {
      const double* row = &embedding[set.ids(i)[e] * classes];
      for (int32_t c = 0; c < classes; ++c) {
        logits[c] += set.values(i)[e] * row[c];
      }
    }
  };
  auto adagrad = [learning_rate](double& w, double& sq, double g) {
    sq += g * g;
    w -= learning_rate * g / (std::sqrt(sq) + 1e-8);
  };
  for (int epoch = 0; epoch < epochs; ++epoch) {
    for (int64_t i = 0; i < train.num_examples(); ++i) {
      forward(train, i);
      const double top = *std::max_element(logits.begin(), logits.end());
      double sum = 0;
      for (int32_t c = 0; c < classes; ++c) {
        grad[c] = std::exp(logits[c] - top);
        sum += grad[c];
      }
      for (int32_t c = 0; c < classes; ++c) {
        grad[c] = grad[c] / sum - (c == train.label(i) ? 1.0 : 0.0);
        adagrad(bias[c], b_sq[c], grad[c]);
      }
      for (size_t e = 0; e < train.ids(i).size(); ++e) {
        const int64_t base = train.ids(i)[e] * classes;
        for (int32_t c = 0; c < classes; ++c) {
          adagrad(embedding[base + c], e_sq[base + c],
                  train.values(i)[e] * grad[c]);
        }
      }
    }
  }
  int64_t right = 0;
  for (int64_t i = 0; i < test.num_examples(); ++i) {
    forward(test, i);
    right += std::max_element(logits.begin(), logits.end()) - logits.begin() ==
             test.label(i);
  }
  return static_cast<double>(right) / test.num_examples();
}

TEST(SyntheticSparseTest, DefaultsAreLearnableToWithinTwoPointsOfBayes) {
  absl::StatusOr<SyntheticSparse> data = GenerateSyntheticSparse();
  ASSERT_TRUE(data.ok()) << data.status();
  const auto start = std::chrono::steady_clock::now();
  const double accuracy =
      TrainEmbeddingBag(data->train, data->test, /*epochs=*/3,
                        /*learning_rate=*/0.05);
  std::cout << "embedding bag: test accuracy " << accuracy
            << " (Bayes " << data->bayes_accuracy << ", ground truth on this "
            << "test set " << data->ground_truth_test_accuracy << ") in "
            << std::chrono::duration<double>(
                   std::chrono::steady_clock::now() - start).count()
            << " s\n";
  EXPECT_GE(accuracy, data->bayes_accuracy - 0.02);
}

}  // namespace
}  // namespace grps
