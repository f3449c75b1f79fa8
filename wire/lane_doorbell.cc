#include "wire/lane_doorbell.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "wire/wire_format.h"

namespace grps {
namespace {

// Byte offsets of the words of the area's head and of a slot's head.
constexpr uint32_t kRingWord = 0, kBeatWord = 4;
constexpr uint32_t kRequestWord = 0, kAnswerWord = 4, kRequestBytesWord = 8, kCodeWord = 12,
                   kReplyBytesWord = 16;

uint32_t* Word(char* base, uint32_t offset) {
  return reinterpret_cast<uint32_t*>(base + offset);
}
uint32_t Load(const char* base, uint32_t offset) {
  return __atomic_load_n(reinterpret_cast<const uint32_t*>(base + offset), __ATOMIC_ACQUIRE);
}
void Store(char* base, uint32_t offset, uint32_t value) {
  __atomic_store_n(Word(base, offset), value, __ATOMIC_RELEASE);
}

// Sleeps while *word == expected, at most `timeout` (not FUTEX_PRIVATE: the
// word is in memory another process maps).
void FutexWait(const uint32_t* word, uint32_t expected, absl::Duration timeout) {
  if (timeout <= absl::ZeroDuration()) return;
  const timespec ts = absl::ToTimespec(timeout);
  syscall(SYS_futex, word, FUTEX_WAIT, expected, &ts, nullptr, 0);
}
void FutexWakeAll(uint32_t* word) { syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0); }

grpc::ByteBuffer CopyIn(const char* src, size_t bytes) {
  grpc::Slice slice(src, bytes);
  return grpc::ByteBuffer(&slice, 1);
}

}  // namespace

absl::Status LaneDoorbell::CheckGeometry(uint32_t slots, uint32_t slot_bytes) {
  if (slots < 1 || slots > kMaxDoorbellSlots)
    return absl::InvalidArgumentError(
        absl::StrCat("a doorbell of ", slots, " slots (1 to ", kMaxDoorbellSlots, ")"));
  if (slot_bytes < kMinDoorbellSlotBytes || slot_bytes > kMaxDoorbellSlotBytes ||
      slot_bytes % 64 != 0)
    return absl::InvalidArgumentError(
        absl::StrCat("doorbell slots of ", slot_bytes, " bytes (a multiple of 64 from ",
                     kMinDoorbellSlotBytes, " to ", kMaxDoorbellSlotBytes, ")"));
  return absl::OkStatus();
}

uint32_t LaneDoorbell::SlotBytesFor(uint32_t capacity) {
  const uint64_t bytes = kDoorbellHeadBytes + 2 * uint64_t{capacity};
  return static_cast<uint32_t>(std::clamp<uint64_t>((bytes + 63) / 64 * 64, kMinDoorbellSlotBytes,
                                                    kMaxDoorbellSlotBytes));
}

uint32_t LaneDoorbell::Ring(uint32_t slot, const grpc::ByteBuffer& request) {
  char* s = Slot(slot);
  const uint32_t bytes = static_cast<uint32_t>(std::min<size_t>(request.Length(), capacity()));
  CopyBufferBytes(request, s + kDoorbellHeadBytes);
  Store(s, kRequestBytesWord, bytes);
  const uint32_t seq = Load(s, kRequestWord) + 1;
  Store(s, kRequestWord, seq);
  __atomic_add_fetch(Word(base_, kRingWord), 1, __ATOMIC_RELEASE);
  FutexWakeAll(Word(base_, kRingWord));
  return seq;
}

bool LaneDoorbell::AwaitAnswer(uint32_t slot, uint32_t seq, absl::Duration timeout) const {
  const char* s = Slot(slot);
  const absl::Time until = absl::Now() + timeout;
  while (true) {
    const uint32_t answered = Load(s, kAnswerWord);
    if (answered == seq) return true;
    const absl::Duration left = until - absl::Now();
    if (left <= absl::ZeroDuration()) return false;
    FutexWait(reinterpret_cast<const uint32_t*>(s + kAnswerWord), answered, left);
  }
}

absl::Status LaneDoorbell::TakeAnswer(uint32_t slot, grpc::ByteBuffer* reply) const {
  const char* s = Slot(slot);
  const uint32_t code = Load(s, kCodeWord);
  const uint32_t bytes = Load(s, kReplyBytesWord);
  if (bytes > capacity())
    return absl::DataLossError(absl::StrCat("a doorbell answer of ", bytes,
                                            " bytes in a slot for ", capacity()));
  if (code > static_cast<uint32_t>(absl::StatusCode::kUnauthenticated))
    return absl::DataLossError(absl::StrCat("a doorbell answer with status code ", code));
  const char* data = s + kDoorbellHeadBytes + capacity();
  if (code == 0) {
    *reply = CopyIn(data, bytes);
    return absl::OkStatus();
  }
  return absl::Status(static_cast<absl::StatusCode>(code), std::string(data, bytes));
}

uint32_t LaneDoorbell::beat() const { return Load(base_, kBeatWord); }

uint32_t LaneDoorbell::rings() const { return Load(base_, kRingWord); }

void LaneDoorbell::AwaitRing(uint32_t seen, absl::Duration timeout) const {
  if (rings() != seen) return;
  FutexWait(reinterpret_cast<const uint32_t*>(base_ + kRingWord), seen, timeout);
}

void LaneDoorbell::Wake() const { FutexWakeAll(Word(base_, kRingWord)); }

uint32_t LaneDoorbell::request_seq(uint32_t slot) const { return Load(Slot(slot), kRequestWord); }

uint32_t LaneDoorbell::answer_seq(uint32_t slot) const { return Load(Slot(slot), kAnswerWord); }

absl::Status LaneDoorbell::TakeRequest(uint32_t slot, grpc::ByteBuffer* request) const {
  const char* s = Slot(slot);
  const uint32_t bytes = Load(s, kRequestBytesWord);
  if (bytes == 0 || bytes > capacity())
    return absl::InvalidArgumentError(absl::StrCat("a doorbell request of ", bytes,
                                                   " bytes in a slot for ", capacity()));
  *request = CopyIn(s + kDoorbellHeadBytes, bytes);
  return absl::OkStatus();
}

void LaneDoorbell::Answer(uint32_t slot, uint32_t seq, const absl::Status& status,
                          const grpc::ByteBuffer& reply) {
  char* s = Slot(slot);
  char* data = s + kDoorbellHeadBytes + capacity();
  absl::Status answer = status;
  if (answer.ok() && reply.Length() > capacity())
    answer = absl::UnavailableError(absl::StrCat(
        "the reply of ", reply.Length(), " bytes does not fit the doorbell's ", capacity(),
        ": ask through gRPC"));
  if (answer.ok()) {
    CopyBufferBytes(reply, data);
    Store(s, kReplyBytesWord, static_cast<uint32_t>(reply.Length()));
  } else {
    const size_t bytes = std::min<size_t>(answer.message().size(), capacity());
    std::memcpy(data, answer.message().data(), bytes);
    Store(s, kReplyBytesWord, static_cast<uint32_t>(bytes));
  }
  Store(s, kCodeWord, static_cast<uint32_t>(answer.code()));
  Store(s, kAnswerWord, seq);
  FutexWakeAll(Word(s, kAnswerWord));
}

void LaneDoorbell::Beat() { __atomic_add_fetch(Word(base_, kBeatWord), 1, __ATOMIC_RELEASE); }

}  // namespace grps
