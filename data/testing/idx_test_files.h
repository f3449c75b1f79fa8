// Test-only helpers that write IDX files (plain or gzip) into the test's
// temporary directory, for the data/ tests (IDX, libsvm, CSV and text
// files).
#ifndef GRPS_DATA_TESTING_IDX_TEST_FILES_H_
#define GRPS_DATA_TESTING_IDX_TEST_FILES_H_

#include <cstdint>
#include <string>
#include <vector>

namespace grps {
namespace testing_files {

// The bytes of an IDX file: magic, big-endian dims, then `data` as is (the
// caller may pass fewer or more bytes than the dims declare).
std::string IdxBytes(uint32_t magic, const std::vector<uint32_t>& dims,
                     const std::vector<uint8_t>& data);

// A path under testing::TempDir() unique to the running test and process,
// ending in `name`. Whatever is created there is removed when the test
// program ends.
std::string TempPath(const std::string& name);

// A fresh directory under testing::TempDir(), unique like TempPath.
std::string MakeTempDir(const std::string& name);

// Write `bytes` to `path` as is, or gzip-compressed (zlib gzopen/gzwrite).
// Fail the current test (ADD_FAILURE) on I/O errors.
void WriteFile(const std::string& path, const std::string& bytes);
void WriteGzipFile(const std::string& path, const std::string& bytes);

// Reads a whole file as is (no decompression).
std::string ReadFileBytes(const std::string& path);

}  // namespace testing_files
}  // namespace grps

#endif  // GRPS_DATA_TESTING_IDX_TEST_FILES_H_
