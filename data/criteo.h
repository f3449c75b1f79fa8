// Criteo-shaped click data (issue 43): a streaming reader of the click-log
// TSV of Criteo's Display Advertising Challenge (and of Criteo's 1 TB logs),
// and a generator of files in that format whose hidden model is known, so
// the best AUC any model can reach on them is known too.
//
// The format: one example a line, 40 fields separated by tabs:
//   label        "0" or "1"
//   I1..I13      integers (counts; may be negative), or empty: missing
//   C1..C26      categorical values, hashed to 32 bits and written as 1 to 8
//                hex digits (Criteo's are 8 lowercase ones), or empty
// The reader accepts that and nothing looser: another field count, a label
// other than 0/1, a bad integer or hex value, or a line over kMaxCriteoLine
// bytes is InvalidArgument "PATH:LINE: what is wrong". Files may be plain or
// gzip (the 1f 8b magic bytes decide); they are read as a stream, a buffer
// at a time, so a file of any size reads in bounded memory.
//
// What a model sees (DLRM's preprocessing): a dense feature x becomes
// log(1 + max(x, 0)), a missing one 0; a categorical value becomes its
// 32-bit number as an int64 id of table Cj, a missing one kCriteoMissingId.
//
//   CriteoReader reader = *CriteoReader::Open("train.txt.gz", rank, world);
//   CriteoBatch batch;
//   while (*reader.Next(4096, &batch) > 0) Train(batch);
#ifndef GRPS_DATA_CRITEO_H_
#define GRPS_DATA_CRITEO_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "data/byte_source.h"
#include "data/sparse_dataset.h"

namespace grps {

inline constexpr int kCriteoDense = 13;
inline constexpr int kCriteoTables = 26;
// The id of a missing categorical value: above every 32-bit hash.
inline constexpr int64_t kCriteoMissingId = int64_t{1} << 32;
// The longest line accepted (Criteo's longest is under 300 bytes).
inline constexpr size_t kCriteoMaxLine = 4096;

// Examples in columns, example-major.
struct CriteoBatch {
  int64_t size = 0;
  std::vector<float> labels;  // size: 0 or 1
  std::vector<float> dense;   // size x kCriteoDense, transformed
  std::vector<int64_t> ids;   // size x kCriteoTables

  void Clear() {
    size = 0;
    labels.clear();
    dense.clear();
    ids.clear();
  }
};

// Appends the example of one line (no '\n') to *batch, or returns
// InvalidArgument saying what is wrong (not where) and leaves *batch as it
// was.
absl::Status ParseCriteoLine(absl::string_view line, CriteoBatch* batch);

// One worker's share of a file: the examples whose 0-based line number i has
// i % world == rank, in file order. Every rank reads (and for gzip,
// decompresses) the whole file, parsing only its own lines. Move-only.
class CriteoReader {
 public:
  // NotFound and the like from opening; InvalidArgument for world == 0 or
  // rank >= world.
  static absl::StatusOr<CriteoReader> Open(const std::string& path, uint32_t rank, uint32_t world);

  // Clears *batch and fills it with up to `max` examples of this share;
  // returns how many (0: the file has no more). A malformed line of this
  // share is InvalidArgument "PATH:LINE: ..."; a cut or corrupt gzip stream
  // is DataLoss. After an error the reader is spent.
  absl::StatusOr<int64_t> Next(int64_t max, CriteoBatch* batch);

  // Lines of the file read so far (every rank's).
  int64_t lines() const { return line_; }

 private:
  CriteoReader(ByteSource source, std::string path, uint32_t rank, uint32_t world)
      : source_(std::move(source)), path_(std::move(path)), rank_(rank), world_(world) {}
  // Makes buffer_ hold a whole line from pos_ (or the file's last bytes)
  // and returns where it ends (its '\n', or buffer_.size()); none at the
  // end of the file.
  absl::StatusOr<std::optional<size_t>> Fill();

  ByteSource source_;
  std::string path_;
  uint32_t rank_;
  uint32_t world_;
  std::string buffer_;
  size_t pos_ = 0;
  bool eof_ = false;
  int64_t line_ = 0;
};

// The built-in embedding model's view of Criteo data: 27 fields, a table
// each. Field j < 26 holds the example's value of C(j+1) (one id, value 1; a
// missing one is kCriteoMissingId); field kCriteoDenseField holds the dense
// features as ids 0..12 weighted by their transformed values (those that
// are 0 left out), so that its table's bag is a learned linear map of them.
inline constexpr int32_t kCriteoDenseField = kCriteoTables;
inline constexpr int32_t kCriteoFields = kCriteoTables + 1;

// Reads the whole of `path` (plain or gzip), at most `limit` examples (0: all
// of them), into a SparseDataset of two classes with ids tagged by field
// (FieldFeature, sparse_dataset.h) and no feature-space bound. Errors as
// CriteoReader's, and InvalidArgument "PATH holds no examples" for a file
// without any (as ReadLibsvm's).
absl::StatusOr<SparseDataset> ReadCriteoSparse(const std::string& path, uint64_t limit = 0);

// The generator's hidden model and how it draws examples. Table j's values
// are vocabulary[j] distinct ids, drawn by rank from a power law
// (P(rank r) ~ 1 / (r + 1)^zipf, r < vocabulary[j]); the id of a rank is a
// seeded 32-bit hash of (table, rank). Only the `informative` most frequent
// ranks of each table carry a weight, N(0, weight_sd^2); every other value
// (the long tail that makes the tables large) carries none, so a model can
// learn the truth from data of a size that sees each informative value
// often. Dense feature k is floor(exp(N(dense_mu_k, 1.5^2))) with its own
// weight N(0, dense_weight_sd^2) on log(1 + x) - dense_mu_k. An example's
// click probability is sigmoid(bias + its values' weights + its dense
// terms), its label a draw from it. A categorical value is missing with
// probability missing_categorical (it carries no weight), a dense one with
// missing_dense. The truth is a function of what ParseCriteoLine reads, so
// that a model of those features can reach the stated best: a missing dense
// value reads as 0, as x = 0 does, and counts as x = 0 would (a truth that
// told the two apart would hold information the features lack: a perfect
// learner of them fell short of such a truth's AUC by about 0.006).
struct CriteoSynthOptions {
  uint64_t seed = 1;
  // Per table; empty: Criteo Kaggle's 26 cardinalities times 3 (about 101
  // million values in all). Each >= 1 and < 2^32.
  std::vector<int64_t> vocabulary;
  double zipf = 1.1;  // > 1
  int64_t informative = 2000;
  double weight_sd = 0.6;
  double dense_weight_sd = 0.3;
  double bias = -1.6;
  double missing_categorical = 0.02;
  double missing_dense = 0.1;
};

// Criteo Kaggle's 26 cardinalities, times `scale`.
std::vector<int64_t> CriteoKaggleVocabulary(int64_t scale);

class CriteoSynth {
 public:
  // InvalidArgument for options outside their ranges.
  static absl::StatusOr<CriteoSynth> Create(CriteoSynthOptions options);

  // Writes example `index` of stream `stream` (train and test are distinct
  // streams of the same truth) as one line with its '\n' onto *out, and
  // returns its true click probability. Deterministic in (options, stream,
  // index).
  double Example(uint64_t stream, uint64_t index, std::string* out) const;

  // The true logit of an example as ParseCriteoLine reads it: its 13 dense
  // features and 26 ids. Example's probability is its sigmoid.
  double TrueLogit(const float* dense, const int64_t* ids) const;

  const CriteoSynthOptions& options() const { return options_; }

 private:
  explicit CriteoSynth(CriteoSynthOptions options) : options_(std::move(options)) {}
  uint32_t IdOf(int table, uint64_t rank) const;

  CriteoSynthOptions options_;
  // Per table: informative id -> weight.
  std::vector<absl::flat_hash_map<uint32_t, float>> weights_;
  double dense_weight_[kCriteoDense] = {};
  double dense_mu_[kCriteoDense] = {};
};

}  // namespace grps

#endif  // GRPS_DATA_CRITEO_H_
