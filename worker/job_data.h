// The job's data sets as a worker loads them (JobConfig.dataset): the dense
// formats for the dense models, the sparse ones for the embedding model.
// Every worker loads the whole training set and trains on its partition
// (data/partition.h); any worker may become the evaluator, so each loads
// the test set too.
#ifndef GRPS_WORKER_JOB_DATA_H_
#define GRPS_WORKER_JOB_DATA_H_

#include <string>

#include "absl/status/statusor.h"
#include "data/dataset.h"
#include "data/sparse_dataset.h"
#include "proto/grps.pb.h"

namespace grps {

struct DenseData {
  Dataset train;
  Dataset test;
};

// "idx" or "csv", cut to train_limit / test_limit. InvalidArgument when the
// examples' width is not the job's input_features or a label is not below
// num_classes; the reader's error (naming file and line) as it is.
absl::StatusOr<DenseData> LoadDenseData(const v1::JobConfig& config);

struct SparseData {
  SparseDataset train;
  SparseDataset test;
  // What the data set is, for the log: its size, and for "synthetic" the
  // Bayes accuracy the generator knows.
  std::string description;
  double bayes_accuracy = -1;  // synthetic only; -1 otherwise
};

// "idx-sparse", "libsvm" or "synthetic", cut to train_limit / test_limit,
// every label below num_classes.
absl::StatusOr<SparseData> LoadSparseData(const v1::JobConfig& config);

// The table_rows to hash the data's features with (HashFeatureId): 0 (a
// feature is its own row id) when the table has no row bound, or when both
// sets' feature spaces are bounded and fit in the table's rows, so that no
// two features share a row; else embedding_rows. Decided from the data and
// the config alone, so every worker decides alike.
uint64_t FeatureHashRows(const SparseData& data, uint64_t embedding_rows);

}  // namespace grps

#endif  // GRPS_WORKER_JOB_DATA_H_
