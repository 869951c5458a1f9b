#include "text_util.h"

#include <fmt/format.h>

namespace kdaguard::callio {

std::string shown(std::string_view text) {
  std::string result;
  result.reserve(text.size());
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte >= 0x20 && byte < 0x7f)
      result += c;
    else
      result += fmt::format("\\x{:02x}", byte);
  }
  return result;
}

std::string pointer_segment(std::string_view key) {
  std::string escaped;
  escaped.reserve(key.size());
  for (const char c : key) {
    if (c == '~')
      escaped += "~0";
    else if (c == '/')
      escaped += "~1";
    else
      escaped += c;
  }
  return shown(escaped);
}

}  // namespace kdaguard::callio
