// fuzz_check_json: bytes as a call document into the code behind `kdaguard check`
// (callio::check_document). Invariants:
//   - no crash, no ASan or UBSan report, no "internal error" line, exit code 0, 1 or 2;
//   - the outcome is deterministic;
//   - every well-formed call survives a round trip (call_to_json, parse_call) with its verdict;
//   - every accepted call of AnyCall's four entry points passes the bounds oracle.
#include <fmt/format.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "bounds_oracle.h"
#include "fuzz_failure.h"
#include "gen_calls.h"
#include "kdaguard/callio.h"
#include "kdaguard/contracts/validate.h"

namespace kdaguard::support {
namespace {

void check_text(std::string_view text) {
  const callio::CheckOutcome outcome = callio::check_document(text);
  if (outcome.exit_code < 0 || outcome.exit_code > 2)
    fuzz_failure(fmt::format("check_document exit code {}", outcome.exit_code));
  if (outcome.err.starts_with("internal error") || outcome.err.find("\ninternal error") != std::string::npos)
    fuzz_failure("check_document reports an internal error:\n" + outcome.err);
  const callio::CheckOutcome again = callio::check_document(text);
  if (again.exit_code != outcome.exit_code || again.out != outcome.out || again.err != outcome.err)
    fuzz_failure("check_document gave two outcomes for one document");

  const callio::Document document = callio::parse_document(text);
  for (const callio::DocumentCall& dc : document.calls) {
    const CatalogueCall* call = std::get_if<CatalogueCall>(&dc.call);
    if (call == nullptr) continue;
    const std::string shown = callio::call_to_json(*call).dump();
    const Verdict verdict = validate(*call);
    const callio::CallResult back = callio::parse_call(callio::call_to_json(*call));
    const CatalogueCall* reparsed = std::get_if<CatalogueCall>(&back);
    if (reparsed == nullptr)
      fuzz_failure("a parsed call does not parse back from call_to_json: " +
                   callio::format_error(std::get<callio::DescriptionError>(back)) + "\n" + shown);
    if (!same_verdict(verdict, validate(*reparsed)))
      fuzz_failure("the verdict changed across call_to_json and parse_call:\n" + shown);
    // The bounds oracle walks AnyCall's four entry points (not yet the record-based ones).
    const std::optional<AnyCall> walkable = narrow(*call);
    if (verdict.accepted() && walkable) {
      const BoundsReport report = check_bounds(*walkable);
      if (!report.ok())
        fuzz_failure("accepted call touches memory it may not: " + report.summary() + "\n" +
                     describe_call(*walkable));
    }
  }
}

}  // namespace
}  // namespace kdaguard::support

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  kdaguard::support::check_text(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
