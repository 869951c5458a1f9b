// JSON call descriptions (spec: call-format.md) in and out of the contract layer's call types,
// verdicts as JSON, the rule catalogue as tables, and the whole `kdaguard check` logic as one
// pure function of the input text.
//
// Nothing here throws on bad input: every problem of a description comes back as a
// DescriptionError that says where it is.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "kdaguard/contracts/call.h"
#include "kdaguard/contracts/validate.h"

namespace kdaguard::callio {

// Call descriptions keep their keys in document order (the output reads like the spec's examples,
// and the first problem reported is the first one in the text).
using Json = nlohmann::ordered_json;

// Deeper nesting than this is refused before it is looked at; a call description needs 4 levels.
inline constexpr int kMaxNestingDepth = 64;

// What is wrong with a description, and where. `where` is a JSON pointer into the call
// ("/tensors/q/shape/1"), prefixed by the call's position in a document: "/3/..." for element 3 of
// an array, "line 4 /..." for JSON Lines; parse errors say "line L, column C (byte B)".
// Text taken from the input is shown with non-printable and non-ASCII bytes escaped (\xNN).
struct DescriptionError {
  std::string where;
  std::string message;
};
std::string format_error(const DescriptionError& error);  // "where: message"

// Descriptions cover every entry point of the catalogue (call.h's CatalogueCall).
using CallResult = std::variant<CatalogueCall, DescriptionError>;

// One call description (an object) to a call. Every field of call-format.md; rejected as a
// DescriptionError: unknown fields or tensor names, a tensor the entry point doesn't take, a scalar
// the entry point doesn't take, wrong JSON types, rank > kMaxRank, stride and shape of different
// lengths, non-integers or integers outside int64 where integers go (address: uint64), index values
// outside their dtype's range or not matching the shape's element count, values on a float tensor.
// Everything a TensorView can represent is passed through, however wrong (negative sizes, strides,
// offsets, overflowing extents): judging it is the validator's job.
// Format extensions: "device" defaults to "cuda:0"; the scalars scale and lower_bound also take the
// strings "inf", "-inf" and "nan", which JSON numbers can't spell.
CallResult parse_call(const Json& description);
CallResult parse_call(const nlohmann::json& description);

// The inverse: every present tensor with explicit strides, non-default fields only otherwise.
// parse_call(call_to_json(c)) gives c back for every call the format can describe.
Json call_to_json(const CatalogueCall& call);
Json call_to_json(const AnyCall& call);

// {"entry", "accepted", "violations": [{"rule", "argument", "message"}], "deferred": [{"rule",
// "argument"}]}, in the validator's order.
Json verdict_to_json(Entry entry, const Verdict& verdict);

// A document: one call object, a JSON array of calls, or JSON Lines (one call object per line,
// blank lines skipped). It is read as JSON Lines only when it is not one JSON value and its first
// non-blank line is a call object on its own.
struct DocumentCall {
  std::string origin;  // "" for a lone call, "/3" for element 3 of an array, "line 4" for JSON Lines
  CallResult call;
};
struct Document {
  std::vector<DocumentCall> calls;       // in document order, malformed ones included
  std::optional<DescriptionError> error;  // the document as a whole is unreadable or holds no call
};
Document parse_document(std::string_view text);

// `kdaguard check`: every well-formed call of the document is validated and its verdict printed as
// one line of compact JSON on `out`, in document order. Every malformed call, and an unreadable
// document, gets one line on `err` ("where: message"); the calls around a malformed one are still
// judged. Exit code: 2 when anything was malformed (or the document holds no call), else 1 when any
// verdict rejects, else 0. A pure function of `text`; never throws, whatever the bytes.
// An `err` line starting with "internal error" is a bug of kdaguard, never of the input.
struct CheckOutcome {
  int exit_code = 0;
  std::string out;
  std::string err;
};
CheckOutcome check_document(std::string_view text);

// The same, streamed for big documents: each verdict line and each problem line (without its
// newline) is handed over as soon as it is known, so only one call is held at a time. Returns the
// exit code.
using LineSink = std::function<void(std::string_view line)>;
int check_document(std::string_view text, const LineSink& on_verdict, const LineSink& on_problem);

// The rule catalogue (kdaguard::rule_catalogue()) as an aligned text table, as JSON
// ({"rules": [{"id", "tier", "entry_points", "meaning"}]}) and as a Markdown table. Each ends in
// a newline.
std::string rules_text();
std::string rules_json();
std::string rules_markdown();

}  // namespace kdaguard::callio
