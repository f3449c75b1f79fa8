#include "worker/curve_file.h"

#include "absl/strings/str_cat.h"

namespace grps {

absl::StatusOr<std::unique_ptr<CurveFile>> CurveFile::Create(const std::string& path,
                                                             absl::Time start) {
  // Appended to: a worker started again for its rank adds its rows to its
  // predecessor's (their unix_time orders them), which a new file lost.
  FILE* file = std::fopen(path.c_str(), "a");
  if (file == nullptr)
    return absl::FailedPreconditionError(absl::StrCat("cannot write the curve ", path));
  if (std::ftell(file) == 0)
    std::fputs(
        "step,epoch,elapsed_s,unix_time,loss,samples_per_sec,test_accuracy,test_loss,evaluated,"
        "test_auc\n",
        file);
  std::fflush(file);
  return std::unique_ptr<CurveFile>(new CurveFile(file, start));
}

CurveFile::~CurveFile() { std::fclose(file_); }

void CurveFile::Write(const CurveRow& row, absl::Time now) {
  absl::MutexLock lock(&mu_);
  std::fprintf(file_, "%llu,%u,%.3f,%.3f,%.6f,%.1f,%.6f,%.6f,%d,%.6f\n",
               static_cast<unsigned long long>(row.step), row.epoch,
               absl::ToDoubleSeconds(now - start_), absl::ToDoubleSeconds(now - absl::UnixEpoch()),
               row.loss, row.samples_per_sec, row.test_accuracy, row.test_loss,
               row.evaluated ? 1 : 0, row.test_auc);
  std::fflush(file_);
}

}  // namespace grps
