#include "shardbench/core/cli.h"

#include <cctype>

namespace sb {

int64_t parse_size(const std::string& flag, const std::string& text) {
  const std::string bad = flag + " '" + text + "' is not allowed (a positive size such as 64, 1K, 16M, 1G)";
  size_t pos = 0;
  long double v = 0;
  try {
    v = std::stold(text, &pos);
  } catch (...) {
    throw UsageError(bad);
  }
  std::string unit = text.substr(pos);
  for (char& c : unit) c = char(std::toupper(c));
  if (unit == "B") unit = "";
  const long double mult = unit.empty() ? 1 : unit == "K" || unit == "KB" || unit == "KIB" ? 1024.0L
                           : unit == "M" || unit == "MB" || unit == "MIB"                 ? 1048576.0L
                           : unit == "G" || unit == "GB" || unit == "GIB"                 ? 1073741824.0L
                                                                                          : -1;
  if (mult < 0 || !(v > 0)) throw UsageError(bad);
  const long double bytes = v * mult;
  if (bytes < 1 || bytes > 1e15L) throw UsageError(bad);
  return int64_t(bytes);
}

}  // namespace sb
