#include "launcher/json_text.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace grps {

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          out += absl::StrFormat("\\u%04x", c);
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

std::string JsonNumber(std::optional<double> value) {
  if (!value || !std::isfinite(*value)) return "null";
  return absl::StrFormat("%.6g", *value);
}

std::string JsonUnixTime(double seconds) {
  if (!std::isfinite(seconds)) return "null";
  return absl::StrFormat("%.3f", seconds);
}

std::string JsonArray(const std::vector<uint64_t>& values) {
  return absl::StrCat("[", absl::StrJoin(values, ","), "]");
}

}  // namespace grps
