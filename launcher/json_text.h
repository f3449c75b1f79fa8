// JSON text for the launcher's files (--result_json, Prometheus targets):
// values written as JSON spells them.
#ifndef GRPS_LAUNCHER_JSON_TEXT_H_
#define GRPS_LAUNCHER_JSON_TEXT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace grps {

// A JSON string: quoted, with quotes, backslashes and control characters
// escaped.
std::string JsonString(const std::string& s);
// %.6g, or null when unknown or not finite.
std::string JsonNumber(std::optional<double> value);
// Seconds since the epoch, to the millisecond (more than %.6g keeps).
std::string JsonUnixTime(double seconds);
std::string JsonArray(const std::vector<uint64_t>& values);

}  // namespace grps

#endif  // GRPS_LAUNCHER_JSON_TEXT_H_
