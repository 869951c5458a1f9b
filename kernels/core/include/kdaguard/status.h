// What every entry point returns. A refused call carries the verdict that refused it and has
// touched no memory; nothing here throws.
#pragma once

#include <string>

#include "kdaguard/contracts/validate.h"

namespace kdaguard {

enum class StatusCode {
  ok,
  rejected,      // the contracts refused the call (verdict says why); no memory touched
  unsupported,   // a valid call this backend has no kernel for (detail says why)
  launch_failed, // the backend failed after accepting the call (detail says why)
};

struct Status {
  StatusCode code = StatusCode::ok;
  Verdict verdict;     // filled when code == rejected
  std::string detail;  // a human-readable reason for anything but ok

  bool ok() const { return code == StatusCode::ok; }
  static Status success() { return {}; }
  static Status refused(Verdict v);
  static Status unsupported_because(std::string why);
  static Status failed(std::string why);
};

std::string to_string(const Status& s);

}  // namespace kdaguard
