// Synthetic sparse classification data with a known optimum, for training
// and checking an embedding model (issue 11) without a real data set.
//
// The generating model. Each id r of the vocabulary has a weight W[r][c] per
// class c, drawn from N(0, 1). An example holds features_per_example (k)
// distinct ids, drawn without replacement with probabilities proportional to
// 1 / (rank + 1)^zipf_exponent, so a few ids are hot and many are cold; which
// id has which rank is itself random (a seeded permutation), as with hashed
// features. Each id gets a value: 1, or uniform in [0.5, 1.5) when
// unit_values is false. The example's clean scores are
//   score(x, c) = sum over the example's ids r of value_r * W[r][c]
// and an example whose best score beats the second best by less than
// margin * sqrt(k) (sqrt(k) is a score's standard deviation with unit
// values) is drawn again. The clean label is the argmax (the lowest such
// class on a tie), and with probability label_noise (eps) the label is
// replaced by a class drawn uniformly from all num_classes (C), possibly the
// same one.
//
// Because the noise does not depend on x, predicting the clean argmax is
// Bayes-optimal, and its expected accuracy is exactly
//   bayes_accuracy = 1 - eps + eps / C.
// An embedding bag (embedding dimension >= C; sum pooling, or mean pooling,
// since every example has k ids) with a linear head represents the truth
// exactly: embedding[r] = W[r], the head the identity.
//
// Why the margin: with margin 0 many examples lie so close to the boundary
// that no model learns them from a few hundred sightings per id (100,000
// examples of the defaults then reach only about 72% against Bayes 92.5%).
// Redrawing changes which examples occur, not the Bayes rule; with the
// defaults about 82% of draws are redrawn, yet the id frequencies stay
// close to their Zipf weights (a small vocabulary drifts further: ids with
// large weights make large margins, so are seen more often).
//
// The defaults are learnable: with them (100,000 training examples over
// 10,000 ids, 10 ids an example, mildly skewed so that the coldest ids are in
// about 50 examples and the hottest in about 5,000, 4 classes, eps = 0.1,
// margin 1.25) a linear embedding-bag model trained with Adagrad for three
// epochs comes within 0.6 points of bayes_accuracy (0.925) on the test set
// (seeds 1 to 5); synthetic_sparse_test checks that it comes within 2.
//
// Deterministic: the same options (seed included) give the same data on a
// platform; train, test and the ground truth come from independent random
// streams derived from the seed, so changing num_test leaves the training
// set as it was.
#ifndef GRPS_DATA_SYNTHETIC_SPARSE_H_
#define GRPS_DATA_SYNTHETIC_SPARSE_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "data/sparse_dataset.h"

namespace grps {

struct SyntheticSparseOptions {
  // Examples of each set: >= 1, and at most 2^30 ids a set (num_train *
  // features_per_example <= 2^30, likewise num_test).
  int64_t num_train = 100000;
  int64_t num_test = 10000;
  // The number of ids, so the data sets' feature_space; >= 1, and
  // vocabulary * num_classes <= 2^28 (the ground truth's weights).
  int64_t vocabulary = 10000;
  // Distinct ids per example, in [1, vocabulary].
  int32_t features_per_example = 10;
  // The skew of id frequencies, in [0, 4]: 0 is uniform; 0.5 (the default)
  // makes the hottest of 10,000 ids 100 times as frequent as the coldest;
  // 1 is Zipf's law. Frequencies are kept as integers, the hottest id's
  // about 2^62 / vocabulary, none below 1: a skew too steep for that floor
  // is flattened in the far tail.
  double zipf_exponent = 0.5;
  int32_t num_classes = 4;  // >= 2
  // Examples whose best clean score beats the second best by less than
  // margin * sqrt(k) are drawn again; in [0, 10]. InvalidArgument when
  // 10,000 draws in a row fall short (a margin too large for the data).
  double margin = 1.25;
  // The chance eps that a label is redrawn uniformly; in [0, 1).
  double label_noise = 0.1;
  // Values all 1 (true), or uniform in [0.5, 1.5) (false).
  bool unit_values = true;
  uint64_t seed = 1;
};

struct SyntheticSparse {
  // Both with num_classes classes and feature_space == vocabulary.
  SparseDataset train;
  SparseDataset test;
  // The ground truth's weights, vocabulary x num_classes, row-major:
  // weights[r * num_classes + c] is W[r][c].
  std::vector<float> weights;
  // 1 - eps + eps / C: the expected accuracy of the best possible model.
  double bayes_accuracy = 0;
  // The ground truth's accuracy on `test` as drawn (its labels that the
  // noise left at the clean argmax): bayes_accuracy up to sampling error.
  double ground_truth_test_accuracy = 0;
};

// InvalidArgument, naming the option, when an option is outside the range
// given above.
absl::StatusOr<SyntheticSparse> GenerateSyntheticSparse(
    const SyntheticSparseOptions& options = {});

}  // namespace grps

#endif  // GRPS_DATA_SYNTHETIC_SPARSE_H_
