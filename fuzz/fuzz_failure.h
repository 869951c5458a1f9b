// A broken invariant in a fuzz target: say what and on which call, then abort, which libFuzzer
// records as a crash (with the input saved) and the replay runner as a failed test.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

namespace kdaguard::support {

[[noreturn]] inline void fuzz_failure(const std::string& what) {
  std::fprintf(stderr, "\n==== fuzz invariant broken ====\n%s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace kdaguard::support
