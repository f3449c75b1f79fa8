#include "data/criteo.h"

#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/binary_auc.h"

namespace grps {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string Line(const std::string& label, std::vector<std::string> dense,
                 std::vector<std::string> cats) {
  dense.resize(kCriteoDense);
  cats.resize(kCriteoTables);
  return absl::StrCat(label, "\t", absl::StrJoin(dense, "\t"), "\t", absl::StrJoin(cats, "\t"));
}

std::string TempPath(const std::string& name) {
  return absl::StrCat(::testing::TempDir(), "/criteo_test_", name);
}

void WriteFile(const std::string& path, const std::string& text, bool gzip) {
  if (gzip) {
    gzFile f = gzopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(gzwrite(f, text.data(), text.size()), static_cast<int>(text.size()));
    ASSERT_EQ(gzclose(f), Z_OK);
  } else {
    FILE* f = std::fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(std::fwrite(text.data(), 1, text.size(), f), text.size());
    ASSERT_EQ(std::fclose(f), 0);
  }
}

CriteoSynthOptions SmallOptions() {
  CriteoSynthOptions o;
  o.vocabulary = CriteoKaggleVocabulary(1);
  o.informative = 200;
  return o;
}

TEST(ParseCriteoLine, ReadsLabelDenseAndIdsWithMissingValues) {
  CriteoBatch batch;
  ASSERT_TRUE(
      ParseCriteoLine(Line("1", {"0", "", "-3", "7"}, {"68fd1e64", "", "0", "FFFFFFFF"}), &batch)
          .ok());
  ASSERT_EQ(batch.size, 1);
  EXPECT_THAT(batch.labels, ElementsAre(1.0f));
  EXPECT_FLOAT_EQ(batch.dense[0], 0.0f);
  EXPECT_FLOAT_EQ(batch.dense[1], 0.0f);  // missing
  EXPECT_FLOAT_EQ(batch.dense[2], 0.0f);  // negative: log(1 + max(x, 0))
  EXPECT_FLOAT_EQ(batch.dense[3], std::log1p(7.0f));
  EXPECT_EQ(batch.ids[0], 0x68fd1e64);
  EXPECT_EQ(batch.ids[1], kCriteoMissingId);
  EXPECT_EQ(batch.ids[2], 0);
  EXPECT_EQ(batch.ids[3], 0xffffffffll);
  EXPECT_EQ(batch.ids[25], kCriteoMissingId);
}

TEST(ParseCriteoLine, RefusesWhatIsNotTheFormatAndLeavesTheBatchAlone) {
  const std::string good = Line("0", {}, {});
  struct Case {
    std::string line;
    std::string says;
  } cases[] = {
      {good.substr(0, good.rfind('\t')), "39 fields"},
      {good + "\t", "more than 40 fields"},
      {"", "1 fields"},
      {Line("2", {}, {}), "label \"2\""},
      {Line("", {}, {}), "label \"\""},
      {Line("0", {"1.5"}, {}), "I1"},
      {Line("0", {"", "", "x"}, {}), "I3"},
      {Line("0", {}, {"68fd1e6g"}), "C1: categorical value \"68fd1e6g\" is not hex"},
      {Line("0", {}, {"", "123456789"}), "C2: categorical value \"123456789\" is longer"},
  };
  for (const Case& c : cases) {
    CriteoBatch batch;
    absl::Status s = ParseCriteoLine(c.line, &batch);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << c.line;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.says));
    EXPECT_EQ(batch.size, 0);
    EXPECT_TRUE(batch.labels.empty() && batch.dense.empty() && batch.ids.empty());
  }
}

// Every rank of a world reads its own lines, and together they read every
// line once, in file order, from plain and gzip files alike.
TEST(CriteoReader, RanksShareTheLinesOfPlainAndGzipFiles) {
  absl::StatusOr<CriteoSynth> synth = CriteoSynth::Create(SmallOptions());
  ASSERT_TRUE(synth.ok()) << synth.status();
  std::string text;
  constexpr int kLines = 1000;
  for (int i = 0; i < kLines; ++i) synth->Example(0, i, &text);
  CriteoBatch all;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty()))
    ASSERT_TRUE(ParseCriteoLine(line, &all).ok());
  ASSERT_EQ(all.size, kLines);
  for (bool gzip : {false, true}) {
    const std::string path = TempPath(gzip ? "share.gz" : "share.tsv");
    WriteFile(path, text, gzip);
    constexpr uint32_t kWorld = 3;
    for (uint32_t rank = 0; rank < kWorld; ++rank) {
      absl::StatusOr<CriteoReader> reader = CriteoReader::Open(path, rank, kWorld);
      ASSERT_TRUE(reader.ok()) << reader.status();
      int64_t line = rank;
      CriteoBatch batch;
      while (true) {
        absl::StatusOr<int64_t> n = reader->Next(7, &batch);
        ASSERT_TRUE(n.ok()) << n.status();
        if (*n == 0) break;
        ASSERT_LE(*n, 7);
        for (int64_t e = 0; e < *n; ++e, line += kWorld) {
          ASSERT_EQ(batch.labels[e], all.labels[line]) << line;
          for (int j = 0; j < kCriteoTables; ++j)
            ASSERT_EQ(batch.ids[e * kCriteoTables + j], all.ids[line * kCriteoTables + j]);
          for (int k = 0; k < kCriteoDense; ++k)
            ASSERT_EQ(batch.dense[e * kCriteoDense + k], all.dense[line * kCriteoDense + k]);
        }
      }
      EXPECT_GE(line, kLines) << "rank " << rank << (gzip ? " gzip" : " plain");
      EXPECT_LT(line, kLines + kWorld);
      EXPECT_EQ(reader->lines(), kLines);
    }
  }
}

TEST(CriteoReader, NamesTheFileAndLineOfAMalformedLineInItsShare) {
  std::string text;
  for (int i = 0; i < 6; ++i) absl::StrAppend(&text, Line("0", {}, {}), "\r\n");  // CRLF reads
  absl::StrAppend(&text, Line("0", {"oops"}, {}), "\n");                          // line 7
  const std::string path = TempPath("bad.tsv");
  WriteFile(path, text, false);
  // Rank 0 of 2 owns lines 1, 3, 5 and 7.
  absl::StatusOr<CriteoReader> reader = CriteoReader::Open(path, 0, 2);
  ASSERT_TRUE(reader.ok());
  CriteoBatch batch;
  absl::StatusOr<int64_t> n = reader->Next(100, &batch);
  ASSERT_TRUE(absl::IsInvalidArgument(n.status())) << n.status();
  EXPECT_THAT(std::string(n.status().message()), HasSubstr(path + ":7: I1"));
  // Rank 1 owns 2, 4 and 6, all good.
  reader = CriteoReader::Open(path, 1, 2);
  ASSERT_TRUE(reader.ok());
  n = reader->Next(100, &batch);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 3);
}

TEST(CriteoReader, RefusesOverlongLinesCutGzipAndBadRanks) {
  const std::string long_path = TempPath("long.tsv");
  WriteFile(long_path, std::string(kCriteoMaxLine + 10, '1'), false);
  absl::StatusOr<CriteoReader> reader = CriteoReader::Open(long_path, 0, 1);
  ASSERT_TRUE(reader.ok());
  CriteoBatch batch;
  absl::StatusOr<int64_t> n = reader->Next(1, &batch);
  EXPECT_TRUE(absl::IsInvalidArgument(n.status())) << n.status();
  EXPECT_THAT(std::string(n.status().message()), HasSubstr(":1: line longer than"));

  std::string text;
  absl::StatusOr<CriteoSynth> synth = CriteoSynth::Create(SmallOptions());
  ASSERT_TRUE(synth.ok());
  for (int i = 0; i < 2000; ++i) synth->Example(1, i, &text);
  const std::string gz_path = TempPath("cut.gz");
  WriteFile(gz_path, text, true);
  FILE* f = std::fopen(gz_path.c_str(), "rb");
  ASSERT_NE(f, nullptr);
  std::string bytes(1 << 20, '\0');
  bytes.resize(std::fread(bytes.data(), 1, bytes.size(), f));
  std::fclose(f);
  WriteFile(gz_path, bytes.substr(0, bytes.size() / 2), false);
  reader = CriteoReader::Open(gz_path, 0, 1);
  ASSERT_TRUE(reader.ok());
  absl::Status last;
  for (int i = 0; i < 100 && last.ok(); ++i) {
    n = reader->Next(100, &batch);
    last = n.status();
    if (n.ok() && *n == 0) break;
  }
  EXPECT_TRUE(absl::IsDataLoss(last)) << last;

  EXPECT_TRUE(absl::IsInvalidArgument(CriteoReader::Open(long_path, 2, 2).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(CriteoReader::Open(long_path, 0, 0).status()));
  EXPECT_TRUE(absl::IsNotFound(CriteoReader::Open(TempPath("none"), 0, 1).status()));
}

// The generator: deterministic, ids from a power law (the most frequent
// values of a table are its first ranks), a click rate near the bias's, and
// true probabilities that rank clicks far better than chance.
// The embedding model's view: field j < 26 holds C(j+1)'s id (missing ones
// too), field 26 the dense features that are not 0, by index, weighted by
// their value; a limit stops the read.
TEST(ReadCriteoSparse, GivesEachColumnAFieldAndTheDenseFeaturesOneMore) {
  std::string text;
  absl::StrAppend(&text, Line("1", {"0", "", "-3", "7"}, {"68fd1e64", "", "0", "ff"}), "\n");
  absl::StrAppend(&text,
                  Line("0", {"", "", "", "", "", "", "", "", "", "", "", "", "2"}, {"a", "a", "a"}),
                  "\n");
  absl::StrAppend(&text, Line("1", {}, {}), "\n");
  const std::string path = TempPath("sparse.gz");
  WriteFile(path, text, true);
  absl::StatusOr<SparseDataset> data = ReadCriteoSparse(path);
  ASSERT_TRUE(data.ok()) << data.status();
  ASSERT_EQ(data->num_examples(), 3);
  EXPECT_EQ(data->num_classes(), 2);
  EXPECT_EQ(data->feature_space(), 0u);
  EXPECT_THAT(data->labels(), ElementsAre(1, 0, 1));
  absl::Span<const int64_t> ids = data->ids(0);
  ASSERT_EQ(ids.size(), kCriteoTables + 1u);  // only I4 = 7 of the dense is not 0
  EXPECT_EQ(ids[0], FieldFeature(0, 0x68fd1e64));
  EXPECT_EQ(ids[1], FieldFeature(1, kCriteoMissingId));
  EXPECT_EQ(ids[2], FieldFeature(2, 0));
  EXPECT_EQ(ids[3], FieldFeature(3, 0xff));
  EXPECT_EQ(ids[kCriteoTables], FieldFeature(kCriteoDenseField, 3));
  EXPECT_FLOAT_EQ(data->values(0)[kCriteoTables], std::log1p(7.0f));
  EXPECT_FLOAT_EQ(data->values(0)[0], 1.0f);
  for (int64_t id : ids) EXPECT_LT(FeatureField(id), kCriteoFields);
  ASSERT_EQ(data->ids(1).size(), kCriteoTables + 1u);
  EXPECT_EQ(data->ids(1)[kCriteoTables], FieldFeature(kCriteoDenseField, 12));
  EXPECT_EQ(data->ids(2).size(), static_cast<size_t>(kCriteoTables));
  absl::StatusOr<SparseDataset> two = ReadCriteoSparse(path, 2);
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(two->num_examples(), 2);
  // A malformed line names its file and line, as the reader does.
  WriteFile(path, absl::StrCat(text, Line("2", {}, {}), "\n"), true);
  EXPECT_THAT(std::string(ReadCriteoSparse(path).status().message()), HasSubstr(path + ":4:"));
}

// An empty file would give a job that "completes" with figures of no
// examples: it is refused by name, as the libsvm reader refuses one.
TEST(ReadCriteoSparse, RefusesAFileWithNoExamplesNamingIt) {
  for (bool gzip : {false, true}) {
    const std::string path = TempPath(gzip ? "empty.tsv.gz" : "empty.tsv");
    WriteFile(path, "", gzip);
    absl::StatusOr<SparseDataset> data = ReadCriteoSparse(path);
    ASSERT_FALSE(data.ok()) << path;
    EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(data.status().message(), path + " holds no examples");
  }
}

TEST(CriteoSynth, DrawsAPowerLawWithAKnownModel) {
  absl::StatusOr<CriteoSynth> synth = CriteoSynth::Create(SmallOptions());
  ASSERT_TRUE(synth.ok());
  std::string a, b;
  for (int i = 0; i < 50; ++i) {
    synth->Example(0, i, &a);
    synth->Example(0, i, &b);
  }
  EXPECT_EQ(a, b);
  std::string test;
  synth->Example(1, 0, &test);
  EXPECT_NE(a.substr(0, test.size()), test) << "train and test are different draws";

  constexpr int kExamples = 20000;
  std::string text;
  std::vector<float> p;
  for (int i = 0; i < kExamples; ++i) p.push_back(synth->Example(0, i, &text));
  CriteoBatch batch;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty()))
    ASSERT_TRUE(ParseCriteoLine(line, &batch).ok()) << line;
  ASSERT_EQ(batch.size, kExamples);
  // The truth is a function of what the reader reads: the stated best is
  // within a model of the features' reach.
  int missing_dense = 0;
  for (int64_t e = 0; e < kExamples; ++e) {
    const float* dense = &batch.dense[e * kCriteoDense];
    const double logit = synth->TrueLogit(dense, &batch.ids[e * kCriteoTables]);
    ASSERT_NEAR(1.0 / (1.0 + std::exp(-logit)), p[e], 1e-6) << "example " << e;
    missing_dense += std::count(dense, dense + kCriteoDense, 0.0f);
  }
  EXPECT_GT(missing_dense, kExamples * kCriteoDense / 20);
  std::vector<int32_t> labels(batch.labels.begin(), batch.labels.end());
  double clicks = 0;
  for (float l : batch.labels) clicks += l;
  EXPECT_GT(clicks / kExamples, 0.1);
  EXPECT_LT(clicks / kExamples, 0.45);
  EXPECT_GT(BinaryAuc(p, labels), 0.75);

  // Table C3 (10 million values): a few values are most of the draws, and
  // many values are drawn once.
  absl::flat_hash_map<int64_t, int> count;
  for (int64_t e = 0; e < kExamples; ++e) ++count[batch.ids[e * kCriteoTables + 2]];
  int top = 0, once = 0;
  for (const auto& [id, n] : count) {
    top = std::max(top, n);
    once += n == 1;
  }
  EXPECT_GT(top, kExamples / 20);
  EXPECT_GT(once, kExamples / 20);
}

TEST(CriteoSynth, RefusesOptionsOutsideTheirRanges) {
  CriteoSynthOptions o = SmallOptions();
  o.vocabulary.pop_back();
  EXPECT_TRUE(absl::IsInvalidArgument(CriteoSynth::Create(o).status()));
  o = SmallOptions();
  o.vocabulary[0] = 0;
  EXPECT_TRUE(absl::IsInvalidArgument(CriteoSynth::Create(o).status()));
  o = SmallOptions();
  o.zipf = 1.0;
  EXPECT_TRUE(absl::IsInvalidArgument(CriteoSynth::Create(o).status()));
  o = SmallOptions();
  o.missing_dense = 1.5;
  EXPECT_TRUE(absl::IsInvalidArgument(CriteoSynth::Create(o).status()));
  o = SmallOptions();
  o.weight_sd = NAN;
  EXPECT_TRUE(absl::IsInvalidArgument(CriteoSynth::Create(o).status()));
  EXPECT_TRUE(CriteoSynth::Create(CriteoSynthOptions()).ok());
}

}  // namespace
}  // namespace grps
