// grps-criteo-gen: writes Criteo-shaped click data (data/criteo.h) whose
// hidden model is known, and the best AUC and log loss any model can reach
// on it (the true probabilities' own), as JSON on stdout and in
// --truth_json.
//
//   grps-criteo-gen --train_out=train.tsv.gz --train_examples=10000000
//       --test_out=test.tsv.gz --test_examples=500000 --truth_json=truth.json
//
// A name ending in .gz is written gzip-compressed (level 1). The same flags
// (seed included) write the same files; train and test are different draws
// of the same truth.
#include <zlib.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "data/criteo.h"
#include "worker/binary_auc.h"

ABSL_FLAG(std::string, train_out, "", "the training file (.gz: gzip); empty: none");
ABSL_FLAG(int64_t, train_examples, 10000000, "examples in the training file");
ABSL_FLAG(std::string, test_out, "", "the test file (.gz: gzip); empty: none");
ABSL_FLAG(int64_t, test_examples, 500000, "examples in the test file");
ABSL_FLAG(std::string, truth_json, "", "also write the truth's JSON here");
ABSL_FLAG(uint64_t, seed, 1, "the hidden model's and the draws' seed");
ABSL_FLAG(std::string, vocabulary, "kaggle*3",
          "values per table: 26 comma-separated counts, or kaggle*K (Criteo Kaggle's 26 "
          "cardinalities times K; kaggle*3 is about 101 million values)");
ABSL_FLAG(double, zipf, 1.1, "the power law's exponent (P(rank r) ~ 1/(r+1)^zipf), > 1");
ABSL_FLAG(int64_t, informative, 2000,
          "the most frequent values of each table that carry a weight; the rest carry none");
ABSL_FLAG(double, weight_sd, 0.6, "the informative values' weights' standard deviation");
ABSL_FLAG(double, bias, -1.6, "the click logit's bias (-1.6: about one click in four)");

namespace grps {
namespace {

// Where lines go: a plain or a gzip file.
class Sink {
 public:
  static absl::StatusOr<std::unique_ptr<Sink>> Open(const std::string& path) {
    auto sink = std::unique_ptr<Sink>(new Sink(path));
    if (absl::EndsWith(path, ".gz")) {
      sink->gz_ = gzopen(path.c_str(), "wb1");
      if (sink->gz_ == nullptr) return absl::InternalError(absl::StrCat("cannot write ", path));
      gzbuffer(sink->gz_, 1 << 20);
    } else {
      sink->file_ = std::fopen(path.c_str(), "wb");
      if (sink->file_ == nullptr) return absl::InternalError(absl::StrCat("cannot write ", path));
    }
    return sink;
  }
  absl::Status Write(const std::string& bytes) {
    const bool ok = gz_ != nullptr
                        ? gzwrite(gz_, bytes.data(), bytes.size()) == static_cast<int>(bytes.size())
                        : std::fwrite(bytes.data(), 1, bytes.size(), file_) == bytes.size();
    return ok ? absl::OkStatus() : absl::InternalError(absl::StrCat("writing ", path_, " failed"));
  }
  absl::Status Close() {
    const bool ok = gz_ != nullptr ? gzclose(gz_) == Z_OK : std::fclose(file_) == 0;
    gz_ = nullptr;
    file_ = nullptr;
    return ok ? absl::OkStatus() : absl::InternalError(absl::StrCat("closing ", path_, " failed"));
  }
  ~Sink() {
    if (gz_ != nullptr) gzclose(gz_);
    if (file_ != nullptr) std::fclose(file_);
  }

 private:
  explicit Sink(std::string path) : path_(std::move(path)) {}
  std::string path_;
  gzFile gz_ = nullptr;
  FILE* file_ = nullptr;
};

// Writes `count` examples of `stream`; returns the set's truth as JSON.
absl::StatusOr<std::string> WriteSet(const CriteoSynth& synth, uint64_t stream,
                                     const std::string& path, int64_t count) {
  absl::StatusOr<std::unique_ptr<Sink>> sink = Sink::Open(path);
  if (!sink.ok()) return sink.status();
  std::vector<float> p(static_cast<size_t>(count));
  std::vector<int32_t> labels(static_cast<size_t>(count));
  double logloss = 0;
  int64_t positives = 0;
  std::string chunk;
  for (int64_t i = 0; i < count; ++i) {
    const size_t start = chunk.size();
    const double prob = synth.Example(stream, static_cast<uint64_t>(i), &chunk);
    const bool click = chunk[start] == '1';
    p[i] = static_cast<float>(prob);
    labels[i] = click ? 1 : 0;
    positives += click;
    logloss -= std::log(click ? prob : 1.0 - prob);
    if (chunk.size() >= (1 << 20) || i + 1 == count) {
      if (absl::Status s = (*sink)->Write(chunk); !s.ok()) return s;
      chunk.clear();
    }
  }
  if (absl::Status s = (*sink)->Close(); !s.ok()) return s;
  return absl::StrFormat(
      "{\"path\": \"%s\", \"examples\": %d, \"positives\": %d, \"best_auc\": %.6f, "
      "\"best_logloss\": %.6f}",
      path, count, positives, BinaryAuc(p, labels), count > 0 ? logloss / count : 0.0);
}

absl::StatusOr<std::vector<int64_t>> Vocabulary(const std::string& spec) {
  int64_t scale = 0;
  if (absl::StartsWith(spec, "kaggle*") && absl::SimpleAtoi(spec.substr(7), &scale) && scale >= 1)
    return CriteoKaggleVocabulary(scale);
  std::vector<int64_t> out;
  for (absl::string_view part : absl::StrSplit(spec, ',')) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(part, &v))
      return absl::InvalidArgumentError(absl::StrCat("--vocabulary: \"", part, "\" is no count"));
    out.push_back(v);
  }
  return out;
}

int Main() {
  absl::StatusOr<std::vector<int64_t>> vocabulary = Vocabulary(absl::GetFlag(FLAGS_vocabulary));
  CriteoSynthOptions options;
  if (vocabulary.ok()) options.vocabulary = *vocabulary;
  options.seed = absl::GetFlag(FLAGS_seed);
  options.zipf = absl::GetFlag(FLAGS_zipf);
  options.informative = absl::GetFlag(FLAGS_informative);
  options.weight_sd = absl::GetFlag(FLAGS_weight_sd);
  options.bias = absl::GetFlag(FLAGS_bias);
  absl::StatusOr<CriteoSynth> synth =
      vocabulary.ok() ? CriteoSynth::Create(options) : vocabulary.status();
  if (!synth.ok()) {
    std::fprintf(stderr, "grps-criteo-gen: %s\n", std::string(synth.status().message()).c_str());
    return 2;
  }
  const struct {
    const char* name;
    std::string path;
    int64_t count;
  } sets[] = {{"train", absl::GetFlag(FLAGS_train_out), absl::GetFlag(FLAGS_train_examples)},
              {"test", absl::GetFlag(FLAGS_test_out), absl::GetFlag(FLAGS_test_examples)}};
  int64_t values = 0;
  for (int64_t v : synth->options().vocabulary) values += v;
  std::string json = absl::StrFormat(
      "{\"seed\": %d, \"zipf\": %g, \"informative\": %d, \"tables\": %d, \"values\": %d",
      options.seed, options.zipf, options.informative, kCriteoTables, values);
  for (uint64_t stream = 0; stream < 2; ++stream) {
    if (sets[stream].path.empty()) continue;
    if (sets[stream].count < 0) {
      std::fprintf(stderr, "grps-criteo-gen: --%s_examples < 0\n", sets[stream].name);
      return 2;
    }
    absl::StatusOr<std::string> truth =
        WriteSet(*synth, stream, sets[stream].path, sets[stream].count);
    if (!truth.ok()) {
      std::fprintf(stderr, "grps-criteo-gen: %s\n", std::string(truth.status().message()).c_str());
      return 1;
    }
    absl::StrAppend(&json, ", \"", sets[stream].name, "\": ", *truth);
  }
  json += "}\n";
  std::fputs(json.c_str(), stdout);
  const std::string truth_path = absl::GetFlag(FLAGS_truth_json);
  if (!truth_path.empty()) {
    FILE* f = std::fopen(truth_path.c_str(), "w");
    if (f == nullptr || std::fputs(json.c_str(), f) < 0 || std::fclose(f) != 0) {
      std::fprintf(stderr, "grps-criteo-gen: cannot write %s\n", truth_path.c_str());
      return 1;
    }
  }
  return 0;
}

}  // namespace
}  // namespace grps

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "writes Criteo-shaped click data with a known best AUC (data/criteo.h)");
  absl::ParseCommandLine(argc, argv);
  return grps::Main();
}
