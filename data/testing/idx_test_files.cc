#include "data/testing/idx_test_files.h"

#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace grps {
namespace testing_files {
namespace {

// Every path handed out by TempPath, removed (recursively) when the test
// program ends, so runs leave nothing behind in the temporary directory.
class TempPathCleanup : public ::testing::Environment {
 public:
  static TempPathCleanup* Get() {
    static TempPathCleanup* cleanup = [] {
      auto* env = new TempPathCleanup;  // owned by GoogleTest
      ::testing::AddGlobalTestEnvironment(env);
      return env;
    }();
    return cleanup;
  }

  void Add(const std::string& path) {
    std::lock_guard<std::mutex> lock(mu_);
    paths_.push_back(path);
  }

  void TearDown() override {
    std::lock_guard<std::mutex> lock(mu_);
    for (const std::string& path : paths_) {
      std::error_code ignored;
      std::filesystem::remove_all(path, ignored);
    }
    paths_.clear();
  }

 private:
  std::mutex mu_;
  std::vector<std::string> paths_;
};

// Registers the cleanup before RUN_ALL_TESTS starts, so its TearDown runs.
const TempPathCleanup* const kRegisterCleanup = TempPathCleanup::Get();

}  // namespace

std::string IdxBytes(uint32_t magic, const std::vector<uint32_t>& dims,
                     const std::vector<uint8_t>& data) {
  std::string bytes;
  auto put32 = [&bytes](uint32_t v) {
    for (int shift = 24; shift >= 0; shift -= 8) {
      bytes.push_back(static_cast<char>((v >> shift) & 0xff));
    }
  };
  put32(magic);
  for (uint32_t d : dims) put32(d);
  bytes.append(data.begin(), data.end());
  return bytes;
}

std::string TempPath(const std::string& name) {
  const ::testing::TestInfo* info =
      ::testing::UnitTest::GetInstance()->current_test_info();
  std::string dir = ::testing::TempDir();
  if (!dir.empty() && dir.back() != '/') dir.push_back('/');
  std::string path = absl::StrCat(dir, "grps_data_", info->test_suite_name(),
                                  "_", info->name(), "_", getpid(), "_", name);
  TempPathCleanup::Get()->Add(path);
  return path;
}

std::string MakeTempDir(const std::string& name) {
  const std::string dir = TempPath(name);
  if (mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    ADD_FAILURE() << "cannot create directory " << dir;
  }
  return dir;
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) ADD_FAILURE() << "cannot write " << path;
}

void WriteGzipFile(const std::string& path, const std::string& bytes) {
  gzFile gz = gzopen(path.c_str(), "wb");
  if (gz == nullptr) {
    ADD_FAILURE() << "cannot open " << path << " for gzip writing";
    return;
  }
  const int written =
      gzwrite(gz, bytes.data(), static_cast<unsigned>(bytes.size()));
  const int closed = gzclose(gz);
  if (written != static_cast<int>(bytes.size()) || closed != Z_OK) {
    ADD_FAILURE() << "cannot write gzip file " << path;
  }
}

std::string ReadFileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in),
                     std::istreambuf_iterator<char>());
}

}  // namespace testing_files
}  // namespace grps
