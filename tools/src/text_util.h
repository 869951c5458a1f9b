// Showing text taken from untrusted input inside messages.
#pragma once

#include <string>
#include <string_view>

namespace kdaguard::callio {

// Printable ASCII as is; every other byte (control, DEL, anything >= 0x80, so also invalid
// UTF-8) as \xNN, so messages stay one readable line of ASCII whatever the input held.
std::string shown(std::string_view text);

// One JSON pointer segment (RFC 6901: '~' -> "~0", '/' -> "~1"), shown as above.
std::string pointer_segment(std::string_view key);

}  // namespace kdaguard::callio

namespace kdaguard::callio {

// "an integer", "an array", ... for messages that say what was found instead.
template <class J>
std::string json_kind(const J& j) {
  if (j.is_number_float()) return "a number with a fraction or exponent";
  if (j.is_number()) return "an integer";
  if (j.is_array()) return "an array";
  if (j.is_object()) return "an object";
  if (j.is_string()) return "a string";
  if (j.is_boolean()) return "a boolean";
  if (j.is_null()) return "null";
  return "a binary value";
}

}  // namespace kdaguard::callio
