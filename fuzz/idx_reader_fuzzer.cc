// Fuzz target: the IDX reader (data/idx_reader.h), which reads the dataset
// files every worker loads. The input is a file's bytes: it is written to an
// in-memory file (memfd; a temporary file where there is none) and read with
// ReadIdxFile, ReadIdxImages and ReadIdxLabels, as stored (a gzip file when
// it starts with 1f 8b) and once more gzip-compressed, so that both of the
// reader's paths see every header and payload the fuzzer makes up.
//
// The readers get a 1 MiB limit (their max_bytes), so no input makes them
// allocate more. Besides not crashing: a file and its gzip-compressed copy
// must read alike (the same status code, the same array), and an array that
// is read must hold exactly the product of its dimensions.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>
#include <zlib.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "data/idx_reader.h"
#include "fuzz/fuzz_check.h"

namespace grps {
namespace {

constexpr uint64_t kMaxBytes = uint64_t{1} << 20;

// The one file inputs are written to, for the process's lifetime.
class InputFile {
 public:
  InputFile() {
    fd_ = memfd_create("grps-idx-fuzz", 0);
    if (fd_ >= 0) {
      path_ = absl::StrCat("/proc/self/fd/", fd_);
      return;
    }
    const char* tmp = std::getenv("TMPDIR");
    std::string name = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/grps-idx-fuzz-XXXXXX");
    fd_ = mkstemp(name.data());
    FUZZ_CHECK(fd_ >= 0, "cannot create a temporary file");
    unlink(name.c_str());  // the reader opens it through /proc
    path_ = absl::StrCat("/proc/self/fd/", fd_);
  }

  // Replaces the file's contents; the path to read it by.
  const std::string& Write(const void* data, size_t size) {
    FUZZ_CHECK(ftruncate(fd_, 0) == 0, "ftruncate failed");
    FUZZ_CHECK(pwrite(fd_, data, size, 0) == static_cast<ssize_t>(size), "pwrite failed");
    return path_;
  }

 private:
  int fd_ = -1;
  std::string path_;
};

std::string Gzip(const uint8_t* data, size_t size) {
  z_stream z{};
  FUZZ_CHECK(deflateInit2(&z, 1, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) == Z_OK,
             "deflateInit2 failed");
  std::string out(deflateBound(&z, size), '\0');
  z.next_in = const_cast<Bytef*>(data);
  z.avail_in = static_cast<uInt>(size);
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  FUZZ_CHECK(deflate(&z, Z_FINISH) == Z_STREAM_END, "deflate did not finish");
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

uint64_t Product(const std::vector<uint32_t>& dims) {
  uint64_t n = 1;
  for (uint32_t d : dims) n *= d;
  return n;
}

// What the three readers made of one file, comparably.
struct Reading {
  absl::StatusCode file, images, labels;
  IdxArray array;
  IdxImages image_set;
  IdxLabels label_set;
};

Reading ReadAll(const std::string& path) {
  Reading r;
  absl::StatusOr<IdxArray> array = ReadIdxFile(path, kMaxBytes);
  r.file = array.status().code();
  if (array.ok()) {
    FUZZ_CHECK(array->data.size() == Product(array->dims),
               absl::StrCat(array->data.size(), " bytes for ", array->dims.size(), " dims"));
    r.array = std::move(*array);
  }
  absl::StatusOr<IdxImages> images = ReadIdxImages(path, kMaxBytes);
  r.images = images.status().code();
  if (images.ok()) {
    FUZZ_CHECK(images->rows >= 1 && images->cols >= 1, "an image set without pixels");
    FUZZ_CHECK(images->pixels.size() ==
                   static_cast<uint64_t>(images->count * images->rows * images->cols),
               absl::StrCat(images->pixels.size(), " pixels for ", images->count, " images"));
    r.image_set = std::move(*images);
  }
  absl::StatusOr<IdxLabels> labels = ReadIdxLabels(path, kMaxBytes);
  r.labels = labels.status().code();
  if (labels.ok()) r.label_set = std::move(*labels);
  return r;
}

bool Same(const Reading& a, const Reading& b) {
  return a.file == b.file && a.images == b.images && a.labels == b.labels &&
         a.array.dims == b.array.dims && a.array.data == b.array.data &&
         a.image_set.count == b.image_set.count && a.image_set.rows == b.image_set.rows &&
         a.image_set.cols == b.image_set.cols && a.image_set.pixels == b.image_set.pixels &&
         a.label_set.labels == b.label_set.labels;
}

}  // namespace
}  // namespace grps

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace grps;
  static InputFile* const file = new InputFile();
  const Reading stored = ReadAll(file->Write(data, size));
  const std::string compressed = Gzip(data, size);
  const Reading unzipped = ReadAll(file->Write(compressed.data(), compressed.size()));
  // A stored file that is itself gzip is read through gzip; its compressed
  // copy, once unzipped, is gzip bytes and no IDX file.
  const bool stored_is_gzip = size >= 2 && data[0] == 0x1f && data[1] == 0x8b;
  if (!stored_is_gzip)
    FUZZ_CHECK(Same(stored, unzipped), "a file and its gzip-compressed copy read differently");
  return 0;
}
