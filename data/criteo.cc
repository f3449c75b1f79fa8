#include "data/criteo.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "data/split_mix.h"
#include "data/text_file.h"

namespace grps {
namespace {

constexpr int kFields = 1 + kCriteoDense + kCriteoTables;
static_assert(kCriteoMissingId < kFieldValueLimit, "a Criteo id is a field's value");
constexpr size_t kReadBytes = size_t{1} << 20;

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

absl::StatusOr<int64_t> ParseHexId(absl::string_view field) {
  if (field.empty()) return kCriteoMissingId;
  if (field.size() > 8) {
    return absl::InvalidArgumentError(
        absl::StrCat("categorical value \"", field, "\" is longer than 8 hex digits"));
  }
  int64_t id = 0;
  for (char c : field) {
    const int d = HexDigit(c);
    if (d < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("categorical value \"", field, "\" is not hex"));
    }
    id = id * 16 + d;
  }
  return id;
}

// A counter-based stream of uniform numbers: the same (key, index) gives the
// same stream on every platform.
class Stream {
 public:
  explicit Stream(uint64_t key) : state_(SplitMix64(key)) {}
  uint64_t Bits() {
    state_ += 0x9e3779b97f4a7c15ull;
    return SplitMix64(state_);
  }
  // Uniform in [0, 1).
  double Uniform() { return static_cast<double>(Bits() >> 11) * 0x1.0p-53; }
  double Normal() {
    const double u = 1.0 - Uniform();  // (0, 1]
    return std::sqrt(-2.0 * std::log(u)) * std::cos(2.0 * M_PI * Uniform());
  }

 private:
  uint64_t state_;
};

void AppendHex8(uint32_t v, std::string* out) {
  static constexpr char kDigits[] = "0123456789abcdef";
  char buf[8];
  for (int i = 7; i >= 0; --i, v >>= 4) buf[i] = kDigits[v & 15];
  out->append(buf, 8);
}

// A dense count as a feature: log(1 + max(x, 0)). The reader and the
// generator's truth both use it, so that the truth is a function of what is
// read.
float DenseFeature(int64_t x) {
  return static_cast<float>(std::log1p(static_cast<double>(std::max<int64_t>(x, 0))));
}

}  // namespace

absl::Status ParseCriteoLine(absl::string_view line, CriteoBatch* batch) {
  absl::string_view fields[kFields];
  int n = 0;
  for (size_t start = 0;;) {
    const size_t tab = line.find('\t', start);
    if (n == kFields) {
      return absl::InvalidArgumentError(absl::StrCat("more than ", kFields, " fields"));
    }
    fields[n++] = line.substr(start, tab == absl::string_view::npos ? tab : tab - start);
    if (tab == absl::string_view::npos) break;
    start = tab + 1;
  }
  if (n != kFields) {
    return absl::InvalidArgumentError(
        absl::StrCat(n, " fields where Criteo's format has ", kFields,
                     " (a label, 13 integers and 26 categorical values, tab-separated)"));
  }
  if (fields[0] != "0" && fields[0] != "1") {
    return absl::InvalidArgumentError(absl::StrCat("label \"", fields[0], "\" is not 0 or 1"));
  }
  float dense[kCriteoDense];
  for (int k = 0; k < kCriteoDense; ++k) {
    const absl::string_view f = fields[1 + k];
    if (f.empty()) {
      dense[k] = 0;
      continue;
    }
    absl::StatusOr<int64_t> x = ParseInt64(f);
    if (!x.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("I", k + 1, ": ", x.status().message()));
    }
    dense[k] = DenseFeature(*x);
  }
  int64_t ids[kCriteoTables];
  for (int j = 0; j < kCriteoTables; ++j) {
    absl::StatusOr<int64_t> id = ParseHexId(fields[1 + kCriteoDense + j]);
    if (!id.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("C", j + 1, ": ", id.status().message()));
    }
    ids[j] = *id;
  }
  batch->labels.push_back(fields[0] == "1" ? 1.0f : 0.0f);
  batch->dense.insert(batch->dense.end(), dense, dense + kCriteoDense);
  batch->ids.insert(batch->ids.end(), ids, ids + kCriteoTables);
  ++batch->size;
  return absl::OkStatus();
}

absl::StatusOr<CriteoReader> CriteoReader::Open(const std::string& path, uint32_t rank,
                                                uint32_t world) {
  if (world == 0 || rank >= world) {
    return absl::InvalidArgumentError(
        absl::StrFormat("rank %d of %d workers: a rank must be below the count", rank, world));
  }
  absl::StatusOr<ByteSource> source = ByteSource::Open(path, "a Criteo TSV file");
  if (!source.ok()) return source.status();
  return CriteoReader(std::move(*source), path, rank, world);
}

absl::StatusOr<std::optional<size_t>> CriteoReader::Fill() {
  while (true) {
    if (size_t end = buffer_.find('\n', pos_); end != std::string::npos) return end;
    if (buffer_.size() - pos_ > kCriteoMaxLine) {
      return LineError(path_, line_ + 1,
                       absl::StrCat("line longer than ", kCriteoMaxLine, " bytes"));
    }
    if (eof_) {
      if (pos_ < buffer_.size()) return buffer_.size();
      return std::nullopt;
    }
    buffer_.erase(0, pos_);
    pos_ = 0;
    const size_t have = buffer_.size();
    buffer_.resize(have + kReadBytes);
    absl::StatusOr<size_t> got = source_.Read(buffer_.data() + have, kReadBytes, path_);
    if (!got.ok()) return got.status();
    buffer_.resize(have + *got);
    if (*got < kReadBytes) {
      eof_ = true;
      if (source_.gzip_stream_cut()) {
        return absl::DataLossError(absl::StrCat(path_, ": the gzip stream is cut short"));
      }
    }
  }
}

absl::StatusOr<int64_t> CriteoReader::Next(int64_t max, CriteoBatch* batch) {
  batch->Clear();
  while (batch->size < max) {
    absl::StatusOr<std::optional<size_t>> more = Fill();
    if (!more.ok()) {
      eof_ = true;
      buffer_.clear();
      pos_ = 0;
      return more.status();
    }
    if (!more->has_value()) break;
    const size_t end = **more;
    absl::string_view line(buffer_.data() + pos_, end - pos_);
    pos_ = std::min(end + 1, buffer_.size());
    const int64_t index = line_++;
    if (static_cast<uint64_t>(index) % world_ != rank_) continue;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    absl::Status s = ParseCriteoLine(line, batch);
    if (!s.ok()) {
      eof_ = true;
      buffer_.clear();
      pos_ = 0;
      return LineError(path_, line_, s.message());
    }
  }
  return batch->size;
}

absl::StatusOr<SparseDataset> ReadCriteoSparse(const std::string& path, uint64_t limit) {
  absl::StatusOr<CriteoReader> reader = CriteoReader::Open(path, 0, 1);
  if (!reader.ok()) return reader.status();
  std::vector<int64_t> offsets{0};
  std::vector<int64_t> ids;
  std::vector<float> values;
  std::vector<int32_t> labels;
  CriteoBatch batch;
  constexpr int64_t kBatch = 4096;
  while (limit == 0 || labels.size() < limit) {
    const int64_t want =
        limit == 0 ? kBatch
                   : std::min<int64_t>(kBatch, static_cast<int64_t>(limit - labels.size()));
    absl::StatusOr<int64_t> read = reader->Next(want, &batch);
    if (!read.ok()) return read.status();
    if (*read == 0) break;
    for (int64_t i = 0; i < batch.size; ++i) {
      // Field order is id order: the categorical fields, then the dense one.
      for (int j = 0; j < kCriteoTables; ++j) {
        ids.push_back(FieldFeature(j, batch.ids[i * kCriteoTables + j]));
        values.push_back(1.0f);
      }
      for (int k = 0; k < kCriteoDense; ++k) {
        const float x = batch.dense[i * kCriteoDense + k];
        if (x == 0.0f) continue;
        ids.push_back(FieldFeature(kCriteoDenseField, k));
        values.push_back(x);
      }
      offsets.push_back(static_cast<int64_t>(ids.size()));
      labels.push_back(batch.labels[i] > 0.5f ? 1 : 0);
    }
  }
  // A job given no examples would train or evaluate on nothing and report
  // figures of nothing (a test loss and accuracy of 0).
  if (labels.empty()) return absl::InvalidArgumentError(absl::StrCat(path, " holds no examples"));
  return SparseDataset::Create(2, 0, std::move(offsets), std::move(ids), std::move(values),
                               std::move(labels));
}

std::vector<int64_t> CriteoKaggleVocabulary(int64_t scale) {
  // The distinct values of C1..C26 in Criteo's Kaggle training set.
  static constexpr int64_t kKaggle[kCriteoTables] = {
      1460,  583,  10131227, 2202608, 305, 24,     12517,   633,   3,
      93145, 5683, 8351593,  3194,    27,  14992,  5461306, 10,    5652,
      2173,  4,    7046547,  18,      15,  286181, 105,     142572};
  std::vector<int64_t> out;
  for (int64_t v : kKaggle) out.push_back(v * scale);
  return out;
}

absl::StatusOr<CriteoSynth> CriteoSynth::Create(CriteoSynthOptions options) {
  if (options.vocabulary.empty()) options.vocabulary = CriteoKaggleVocabulary(3);
  if (options.vocabulary.size() != kCriteoTables) {
    return absl::InvalidArgumentError(absl::StrCat("vocabulary: ", options.vocabulary.size(),
                                                   " tables where the format has ", kCriteoTables));
  }
  for (int64_t v : options.vocabulary) {
    if (v < 1 || v >= (int64_t{1} << 32)) {
      return absl::InvalidArgumentError(
          absl::StrCat("vocabulary: ", v, " values in a table (1 to 2^32 - 1)"));
    }
  }
  if (!(options.zipf > 1.0 && options.zipf <= 4.0)) {
    return absl::InvalidArgumentError(absl::StrCat("zipf ", options.zipf, " (above 1, at most 4)"));
  }
  if (options.informative < 0) {
    return absl::InvalidArgumentError(absl::StrCat("informative ", options.informative, " < 0"));
  }
  for (double sd : {options.weight_sd, options.dense_weight_sd}) {
    if (!(sd >= 0 && sd <= 10)) {
      return absl::InvalidArgumentError(absl::StrCat("a weight's sd ", sd, " (0 to 10)"));
    }
  }
  if (!(std::abs(options.bias) <= 20)) {
    return absl::InvalidArgumentError(absl::StrCat("bias ", options.bias, " (-20 to 20)"));
  }
  for (double p : {options.missing_categorical, options.missing_dense}) {
    if (!(p >= 0 && p <= 1)) {
      return absl::InvalidArgumentError(absl::StrCat("a missing rate ", p, " (0 to 1)"));
    }
  }
  CriteoSynth synth(std::move(options));
  const CriteoSynthOptions& o = synth.options_;
  synth.weights_.resize(kCriteoTables);
  for (int j = 0; j < kCriteoTables; ++j) {
    const int64_t hot = std::min(o.informative, o.vocabulary[j]);
    Stream weights(SplitMix64(o.seed) ^ (0x5eed0000ull + static_cast<uint64_t>(j)));
    for (int64_t r = 0; r < hot; ++r) {
      // A hash collision between two informative ranks keeps the first's.
      synth.weights_[j].try_emplace(synth.IdOf(j, r),
                                    static_cast<float>(o.weight_sd * weights.Normal()));
    }
  }
  Stream dense(SplitMix64(o.seed) ^ 0xde75e000ull);
  for (int k = 0; k < kCriteoDense; ++k) {
    synth.dense_mu_[k] = 0.5 + 3.0 * dense.Uniform();
    synth.dense_weight_[k] = o.dense_weight_sd * dense.Normal();
  }
  return synth;
}

uint32_t CriteoSynth::IdOf(int table, uint64_t rank) const {
  return static_cast<uint32_t>(SplitMix64(SplitMix64(options_.seed ^ 0x1d5ull) ^
                                          (static_cast<uint64_t>(table) << 40) ^ rank));
}

double CriteoSynth::TrueLogit(const float* dense, const int64_t* ids) const {
  double logit = options_.bias;
  for (int k = 0; k < kCriteoDense; ++k) logit += dense_weight_[k] * (dense[k] - dense_mu_[k]);
  for (int j = 0; j < kCriteoTables; ++j) {
    if (ids[j] < 0 || ids[j] >= kCriteoMissingId) continue;
    auto it = weights_[j].find(static_cast<uint32_t>(ids[j]));
    if (it != weights_[j].end()) logit += it->second;
  }
  return logit;
}

double CriteoSynth::Example(uint64_t stream, uint64_t index, std::string* out) const {
  const CriteoSynthOptions& o = options_;
  Stream rng(SplitMix64(SplitMix64(o.seed) ^ (stream << 48)) ^ index);
  // The truth is a function of what ParseCriteoLine reads (TrueLogit): a
  // missing dense value reads as x = 0 does, a missing categorical value as
  // kCriteoMissingId (no weight).
  float dense[kCriteoDense];
  int64_t ids[kCriteoTables];
  std::string fields;
  for (int k = 0; k < kCriteoDense; ++k) {
    fields.push_back('\t');
    dense[k] = 0;
    if (rng.Uniform() < o.missing_dense) continue;
    const int64_t x = static_cast<int64_t>(std::floor(std::exp(dense_mu_[k] + 1.5 * rng.Normal())));
    absl::StrAppend(&fields, x);
    dense[k] = DenseFeature(x);
  }
  for (int j = 0; j < kCriteoTables; ++j) {
    fields.push_back('\t');
    const double u = rng.Uniform();
    ids[j] = kCriteoMissingId;
    if (rng.Uniform() < o.missing_categorical) continue;
    // Rank by the inverse of the continuous power law on [1, V + 1).
    const double s1 = 1.0 - o.zipf;
    const double v1 = static_cast<double>(o.vocabulary[j]) + 1.0;
    const double x = std::pow(1.0 + u * (std::pow(v1, s1) - 1.0), 1.0 / s1);
    const uint64_t rank = std::min<uint64_t>(static_cast<uint64_t>(x) - 1,
                                             static_cast<uint64_t>(o.vocabulary[j]) - 1);
    const uint32_t id = IdOf(j, rank);
    AppendHex8(id, &fields);
    ids[j] = id;
  }
  const double p = 1.0 / (1.0 + std::exp(-TrueLogit(dense, ids)));
  out->push_back(rng.Uniform() < p ? '1' : '0');
  out->append(fields);
  out->push_back('\n');
  return p;
}

}  // namespace grps
