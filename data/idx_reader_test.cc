#include "data/idx_reader.h"

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "data/testing/idx_test_files.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace grps {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing_files::IdxBytes;
using testing_files::MakeTempDir;
using testing_files::ReadFileBytes;
using testing_files::TempPath;
using testing_files::WriteFile;
using testing_files::WriteGzipFile;

// Three 2x4 images whose pixel values are 0, 1, ..., 23.
std::vector<uint8_t> Pixels() {
  std::vector<uint8_t> pixels(3 * 2 * 4);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = uint8_t(i);
  return pixels;
}
std::string ImagesFile() {
  return IdxBytes(kIdxImagesMagic, {3, 2, 4}, Pixels());  // 16 + 24 bytes
}

TEST(IdxReaderTest, ReadsPlainImages) {
  const std::string path = TempPath("images");
  WriteFile(path, ImagesFile());
  absl::StatusOr<IdxImages> images = ReadIdxImages(path);
  ASSERT_TRUE(images.ok()) << images.status();
  EXPECT_EQ(images->count, 3);
  EXPECT_EQ(images->rows, 2);
  EXPECT_EQ(images->cols, 4);
  EXPECT_EQ(images->pixels, Pixels());
}

TEST(IdxReaderTest, ReadsPlainLabels) {
  const std::string path = TempPath("labels");
  WriteFile(path, IdxBytes(kIdxLabelsMagic, {4}, {7, 0, 9, 3}));
  absl::StatusOr<IdxLabels> labels = ReadIdxLabels(path);
  ASSERT_TRUE(labels.ok()) << labels.status();
  EXPECT_THAT(labels->labels, ElementsAre(7, 0, 9, 3));
}

TEST(IdxReaderTest, ReadsGzipFilesLikePlainOnes) {
  const std::string images_path = TempPath("images.gz");
  const std::string labels_path = TempPath("labels.gz");
  WriteGzipFile(images_path, ImagesFile());
  WriteGzipFile(labels_path, IdxBytes(kIdxLabelsMagic, {3}, {1, 2, 3}));
  ASSERT_EQ(ReadFileBytes(images_path).substr(0, 2), "\x1f\x8b");
  absl::StatusOr<IdxImages> images = ReadIdxImages(images_path);
  ASSERT_TRUE(images.ok()) << images.status();
  EXPECT_EQ(images->count, 3);
  EXPECT_EQ(images->rows, 2);
  EXPECT_EQ(images->cols, 4);
  EXPECT_EQ(images->pixels, Pixels());
  absl::StatusOr<IdxLabels> labels = ReadIdxLabels(labels_path);
  ASSERT_TRUE(labels.ok()) << labels.status();
  EXPECT_THAT(labels->labels, ElementsAre(1, 2, 3));
}

TEST(IdxReaderTest, DetectsGzipByContentNotByFileName) {
  const std::string gzip_without_suffix = TempPath("images");
  const std::string plain_with_suffix = TempPath("images.gz");
  WriteGzipFile(gzip_without_suffix, ImagesFile());
  WriteFile(plain_with_suffix, ImagesFile());
  for (const std::string& path : {gzip_without_suffix, plain_with_suffix}) {
    absl::StatusOr<IdxImages> images = ReadIdxImages(path);
    ASSERT_TRUE(images.ok()) << path << ": " << images.status();
    EXPECT_EQ(images->pixels, Pixels()) << path;
  }
}

TEST(IdxReaderTest, ReadIdxFileAcceptsAnyDimensionCount) {
  const std::string path = TempPath("array");
  std::vector<uint8_t> data(2 * 1 * 3 * 2, 5);
  WriteFile(path, IdxBytes(0x00000804, {2, 1, 3, 2}, data));
  absl::StatusOr<IdxArray> array = ReadIdxFile(path);
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_THAT(array->dims, ElementsAre(2, 1, 3, 2));
  EXPECT_EQ(array->data, data);
}

TEST(IdxReaderTest, ZeroImagesIsAValidEmptyFile) {
  const std::string path = TempPath("images");
  WriteFile(path, IdxBytes(kIdxImagesMagic, {0, 28, 28}, {}));
  absl::StatusOr<IdxImages> images = ReadIdxImages(path);
  ASSERT_TRUE(images.ok()) << images.status();
  EXPECT_EQ(images->count, 0);
  EXPECT_EQ(images->rows, 28);
  EXPECT_TRUE(images->pixels.empty());
}

TEST(IdxReaderTest, WrongMagicNumberIsInvalidArgumentNamingBoth) {
  const std::string path = TempPath("labels");
  WriteFile(path, IdxBytes(kIdxLabelsMagic, {3}, {1, 2, 3}));
  absl::StatusOr<IdxImages> images = ReadIdxImages(path);
  EXPECT_EQ(images.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(images.status().ToString(),
              AllOf(HasSubstr(path), HasSubstr("0x00000801"),
                    HasSubstr("0x00000803")));

  const std::string images_path = TempPath("images");
  WriteFile(images_path, ImagesFile());
  absl::StatusOr<IdxLabels> labels = ReadIdxLabels(images_path);
  EXPECT_EQ(labels.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(labels.status().ToString(), HasSubstr("0x00000801"));
}

TEST(IdxReaderTest, FileThatIsNotIdxIsInvalidArgument) {
  const std::string path = TempPath("not_idx");
  WriteFile(path, "PK\x03\x04 this is a zip file, not IDX");
  absl::StatusOr<IdxArray> array = ReadIdxFile(path);
  EXPECT_EQ(array.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(array.status().ToString(),
              AllOf(HasSubstr(path), HasSubstr("two zero bytes")));
}

TEST(IdxReaderTest, NonByteElementTypeIsInvalidArgument) {
  const std::string path = TempPath("floats");
  // dtype 0x0D is float32 in the IDX format.
  WriteFile(path, IdxBytes(0x00000D01, {1}, {0, 0, 0, 0}));
  absl::StatusOr<IdxArray> array = ReadIdxFile(path);
  EXPECT_EQ(array.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(array.status().ToString(), HasSubstr("0x0d"));
}

TEST(IdxReaderTest, ZeroDimensionsIsInvalidArgument) {
  const std::string path = TempPath("scalar");
  WriteFile(path, IdxBytes(0x00000800, {}, {42}));
  EXPECT_EQ(ReadIdxFile(path).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(IdxReaderTest, ImagesWithNoPixelsAreInvalidArgument) {
  const std::string path = TempPath("images");
  WriteFile(path, IdxBytes(kIdxImagesMagic, {5, 28, 0}, {}));
  EXPECT_EQ(ReadIdxImages(path).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(IdxReaderTest, TruncatedFileIsDataLossNamingExpectedAndActualBytes) {
  const std::string path = TempPath("images");
  WriteFile(path, ImagesFile().substr(0, 30));  // 40 bytes declared
  absl::StatusOr<IdxImages> images = ReadIdxImages(path);
  EXPECT_EQ(images.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(images.status().ToString(),
              AllOf(HasSubstr(path), HasSubstr("40 bytes"),
                    HasSubstr("only 30 bytes")));
}

TEST(IdxReaderTest, TruncatedGzipFileIsDataLoss) {
  // Enough pixels that the compressed stream is long enough to cut.
  std::vector<uint8_t> pixels(50 * 28 * 28);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = uint8_t(i * 7919);
  const std::string whole = TempPath("whole.gz");
  WriteGzipFile(whole, IdxBytes(kIdxImagesMagic, {50, 28, 28}, pixels));
  const std::string compressed = ReadFileBytes(whole);
  ASSERT_GT(compressed.size(), 100u);

  const std::string cut = TempPath("cut.gz");
  WriteFile(cut, compressed.substr(0, compressed.size() / 2));
  absl::StatusOr<IdxImages> images = ReadIdxImages(cut);
  EXPECT_EQ(images.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(images.status().ToString(),
              AllOf(HasSubstr(cut), HasSubstr("39216 bytes")));

  // All data present but the 8-byte gzip trailer (CRC, size) missing.
  const std::string no_trailer = TempPath("no_trailer.gz");
  WriteFile(no_trailer, compressed.substr(0, compressed.size() - 8));
  EXPECT_EQ(ReadIdxImages(no_trailer).status().code(),
            absl::StatusCode::kDataLoss);
}

TEST(IdxReaderTest, GzipChecksumMismatchIsDataLoss) {
  const std::string whole = TempPath("whole.gz");
  WriteGzipFile(whole, ImagesFile());
  std::string compressed = ReadFileBytes(whole);
  compressed[compressed.size() - 8] ^= 0x5a;  // first byte of the CRC32
  const std::string corrupt = TempPath("corrupt.gz");
  WriteFile(corrupt, compressed);
  absl::StatusOr<IdxImages> images = ReadIdxImages(corrupt);
  EXPECT_EQ(images.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(images.status().ToString(), HasSubstr(corrupt));
}

TEST(IdxReaderTest, TrailingBytesAreDataLoss) {
  const std::string path = TempPath("images");
  WriteFile(path, ImagesFile() + "xyz");
  absl::StatusOr<IdxImages> images = ReadIdxImages(path);
  EXPECT_EQ(images.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(images.status().ToString(),
              AllOf(HasSubstr(path), HasSubstr("43 bytes, more than the 40")));

  const std::string gzip = TempPath("images.gz");
  WriteGzipFile(gzip, ImagesFile() + "xyz");
  images = ReadIdxImages(gzip);
  EXPECT_EQ(images.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(images.status().ToString(),
              AllOf(HasSubstr(gzip), HasSubstr("more than the 40 bytes")));
}

TEST(IdxReaderTest, FileShorterThanHeaderIsDataLoss) {
  const std::string empty = TempPath("empty");
  WriteFile(empty, "");
  EXPECT_EQ(ReadIdxImages(empty).status().code(),
            absl::StatusCode::kDataLoss);

  const std::string two_bytes = TempPath("two_bytes");
  WriteFile(two_bytes, std::string("\0\0", 2));
  EXPECT_EQ(ReadIdxImages(two_bytes).status().code(),
            absl::StatusCode::kDataLoss);

  // Magic and one of three dimensions: the header needs 16 bytes.
  const std::string half_header = TempPath("half_header");
  WriteFile(half_header, ImagesFile().substr(0, 8));
  absl::StatusOr<IdxImages> images = ReadIdxImages(half_header);
  EXPECT_EQ(images.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(images.status().ToString(),
              AllOf(HasSubstr(half_header), HasSubstr("16-byte"),
                    HasSubstr("only 8 bytes")));
}

TEST(IdxReaderTest, NonexistentFileIsNotFound) {
  const std::string path = TempPath("does_not_exist");
  absl::StatusOr<IdxImages> images = ReadIdxImages(path);
  EXPECT_EQ(images.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(images.status().ToString(), HasSubstr(path));
}

TEST(IdxReaderTest, DirectoryIsInvalidArgument) {
  const std::string dir = MakeTempDir("dir");
  EXPECT_EQ(ReadIdxImages(dir).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(IdxReaderTest, HeaderOverMaxBytesIsRejectedBeforeReading) {
  const std::string path = TempPath("images");
  WriteFile(path, ImagesFile());  // 24 bytes of pixels
  absl::StatusOr<IdxImages> images = ReadIdxImages(path, /*max_bytes=*/23);
  EXPECT_EQ(images.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(images.status().ToString(),
              AllOf(HasSubstr(path), HasSubstr("[3, 2, 4]")));
  EXPECT_TRUE(ReadIdxImages(path, /*max_bytes=*/24).ok());
}

TEST(IdxReaderTest, DimensionProductOverflowIsRejectedWithoutAllocating) {
  // 2^32-1 cubed overflows 64 bits; even the limit check must not wrap.
  const std::string path = TempPath("huge");
  WriteFile(path, IdxBytes(kIdxImagesMagic,
                           {0xffffffff, 0xffffffff, 0xffffffff}, {1, 2}));
  absl::StatusOr<IdxImages> images =
      ReadIdxImages(path, /*max_bytes=*/UINT64_MAX);
  EXPECT_EQ(images.status().code(), absl::StatusCode::kResourceExhausted);
}

TEST(IdxReaderTest, HugeHeaderOnShortFileIsDataLossWithoutAllocatingIt) {
  // 2^48 bytes declared, under the limit given, but the files hold 2 bytes:
  // the reader must report the truncation rather than try to allocate.
  const std::vector<uint32_t> dims = {0xffffffff, 0xffff, 1};
  const std::string plain = TempPath("huge");
  WriteFile(plain, IdxBytes(kIdxImagesMagic, dims, {1, 2}));
  absl::StatusOr<IdxImages> images =
      ReadIdxImages(plain, /*max_bytes=*/UINT64_MAX);
  EXPECT_EQ(images.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(images.status().ToString(), HasSubstr("only 18 bytes"));

  const std::string gzip = TempPath("huge.gz");
  WriteGzipFile(gzip, IdxBytes(kIdxImagesMagic, dims, {1, 2}));
  images = ReadIdxImages(gzip, /*max_bytes=*/UINT64_MAX);
  EXPECT_EQ(images.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(images.status().ToString(),
              HasSubstr("only 18 bytes after decompression"));
}

}  // namespace
}  // namespace grps
