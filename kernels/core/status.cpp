#include "kdaguard/status.h"

#include <utility>

namespace kdaguard {

Status Status::refused(Verdict v) {
  Status s;
  s.code = StatusCode::rejected;
  s.detail = describe(v);
  s.verdict = std::move(v);
  return s;
}

Status Status::unsupported_because(std::string why) {
  Status s;
  s.code = StatusCode::unsupported;
  s.detail = std::move(why);
  return s;
}

Status Status::failed(std::string why) {
  Status s;
  s.code = StatusCode::launch_failed;
  s.detail = std::move(why);
  return s;
}

std::string to_string(const Status& s) {
  switch (s.code) {
    case StatusCode::ok: return "ok";
    case StatusCode::rejected: return "rejected:\n" + s.detail;
    case StatusCode::unsupported: return "unsupported: " + s.detail;
    case StatusCode::launch_failed: return "launch failed: " + s.detail;
  }
  return "unknown status";
}

}  // namespace kdaguard
