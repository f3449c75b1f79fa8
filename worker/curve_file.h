// CurveFile: a worker's training curve, one CSV row per report (grps-worker's
// --curve_csv, and grps.torch's GRPS_CURVE_CSV through _grps.CurveFile), in
// the columns grps-local's plots and scripts/grps-compare read:
//
//   step,epoch,elapsed_s,unix_time,loss,samples_per_sec,test_accuracy,test_loss,evaluated,
//   test_auc
//
// elapsed_s counts from the start the caller gives; a figure not known yet
// is -1; evaluated is 1 on a row that carries a new evaluation; test_auc is
// a two-class model's (-1 for others).
//
// Thread safety: Write may be called from any thread.
#ifndef GRPS_WORKER_CURVE_FILE_H_
#define GRPS_WORKER_CURVE_FILE_H_

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace grps {

// One row's figures (WorkerProgress's, for grps-worker).
struct CurveRow {
  uint64_t step = 0;
  uint32_t epoch = 0;
  double loss = -1;
  double samples_per_sec = 0;
  double test_accuracy = -1;
  double test_loss = -1;
  bool evaluated = false;
  double test_auc = -1;  // two-class models
};

class CurveFile {
 public:
  // Creates (truncates) `path` and writes the header. FAILED_PRECONDITION,
  // naming the path, when it cannot be written.
  static absl::StatusOr<std::unique_ptr<CurveFile>> Create(const std::string& path,
                                                           absl::Time start);
  ~CurveFile();
  CurveFile(const CurveFile&) = delete;
  CurveFile& operator=(const CurveFile&) = delete;

  // Appends the row, written at `now`, and flushes it (a reader sees every
  // row at once, also of a worker that is killed).
  void Write(const CurveRow& row, absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  CurveFile(FILE* file, absl::Time start) : file_(file), start_(start) {}

  absl::Mutex mu_;
  FILE* const file_ ABSL_PT_GUARDED_BY(mu_);
  const absl::Time start_;
};

}  // namespace grps

#endif  // GRPS_WORKER_CURVE_FILE_H_
