// Documents of call descriptions (one call, an array of calls, JSON Lines) and `kdaguard check`.
#include <algorithm>
#include <cstddef>
#include <exception>
#include <string>
#include <string_view>
#include <unordered_set>

#include <fmt/format.h>

#include "kdaguard/callio.h"
#include "text_util.h"

namespace kdaguard::callio {
namespace {

// Builds the JSON tree from the parser's events, refusing what a plain parse would accept
// silently or unboundedly: a key given twice in one object (one of the two would be dropped) and
// nesting deeper than kMaxNestingDepth. Errors come back as values, never as exceptions.
class TreeBuilder final : public nlohmann::json_sax<Json> {
 public:
  Json root;
  std::optional<DescriptionError> error;  // `where` is a JSON pointer, or empty for parse errors
  std::optional<std::size_t> error_offset;  // byte offset of a syntax error in the parsed text

  bool null() override { return place(nullptr) != nullptr; }
  bool boolean(bool value) override { return place(value) != nullptr; }
  bool number_integer(number_integer_t value) override { return place(value) != nullptr; }
  bool number_unsigned(number_unsigned_t value) override { return place(value) != nullptr; }
  bool number_float(number_float_t value, const string_t&) override {
    return place(value) != nullptr;
  }
  bool string(string_t& value) override { return place(std::move(value)) != nullptr; }
  bool binary(binary_t& value) override { return place(Json::binary(std::move(value))) != nullptr; }
  bool start_object(std::size_t) override { return open(Json::object()); }
  bool start_array(std::size_t) override { return open(Json::array()); }
  bool end_object() override { return close(); }
  bool end_array() override { return close(); }

  bool key(string_t& name) override {
    Frame& top = stack_.back();
    if (!top.keys.insert(name).second) {
      error = DescriptionError{container_path() + "/" + pointer_segment(name),
                               fmt::format("the key '{}' appears twice in one object", shown(name))};
      return false;
    }
    top.key = std::move(name);
    return true;
  }

  bool parse_error(std::size_t position, const std::string&,
                   const nlohmann::detail::exception& exception) override {
    // what(): "[json.exception.parse_error.101] parse error at line 1, column 10: <reason>";
    // the position is said by the caller in document terms, so only the reason is kept.
    std::string_view what = exception.what();
    if (const std::size_t colon = what.find(": "); colon != std::string_view::npos)
      what.remove_prefix(colon + 2);
    error = DescriptionError{"", shown(what)};
    error_offset = position > 0 ? position - 1 : 0;
    return false;
  }

 private:
  struct Frame {
    Json* container;
    std::string key;                      // objects: the key of the member being read
    std::unordered_set<std::string> keys;  // objects: every key so far (ordered_json looks up
                                           // linearly, which would make big objects quadratic)
  };
  std::vector<Frame> stack_;

  // Puts a finished value where it belongs; returns it, so containers can be opened in place.
  // Pointers into a parent stay valid: a parent gets no new member while a child is open.
  Json* place(Json value) {
    if (stack_.empty()) {
      root = std::move(value);
      return &root;
    }
    Frame& top = stack_.back();
    if (top.container->is_array()) {
      top.container->push_back(std::move(value));
      return &top.container->back();
    }
    // Appended without ordered_json's linear lookup: key() has already refused duplicates.
    auto& members = static_cast<Json::object_t::Container&>(top.container->get_ref<Json::object_t&>());
    members.emplace_back(top.key, std::move(value));
    return &members.back().second;
  }

  bool open(Json container) {
    if (stack_.size() >= static_cast<std::size_t>(kMaxNestingDepth)) {
      std::string where = container_path();
      const Frame& top = stack_.back();
      where += '/';
      where += top.container->is_array() ? std::to_string(top.container->size())
                                         : pointer_segment(top.key);
      error = DescriptionError{std::move(where),
                               fmt::format("nesting deeper than {} levels", kMaxNestingDepth)};
      return false;
    }
    stack_.push_back(Frame{place(std::move(container)), {}, {}});
    return true;
  }

  bool close() {
    stack_.pop_back();
    return true;
  }

  // JSON pointer of the innermost open container.
  std::string container_path() const {
    std::string path;
    for (std::size_t level = 0; level + 1 < stack_.size(); ++level) {
      const Frame& frame = stack_[level];
      path += "/";
      path += frame.container->is_array() ? std::to_string(frame.container->size() - 1)
                                          : pointer_segment(frame.key);
    }
    return path;
  }
};

struct ParsedValue {
  Json value;
  std::optional<DescriptionError> error;
  bool syntax_error = false;  // error->where is a position in the document, not a JSON pointer
};

// Where `text` lies in the document, so that errors can say "line L, column C (byte B)".
struct Placement {
  std::size_t first_byte = 0;  // of the document
  std::size_t first_line = 1;
};

// Counts only within `text`, so that checking every line of a big JSON Lines file stays linear.
std::string position_in(std::string_view text, std::size_t offset, Placement placement) {
  offset = std::min(offset, text.size());
  const std::string_view before = text.substr(0, offset);
  const std::size_t line = placement.first_line +
                           static_cast<std::size_t>(std::count(before.begin(), before.end(), '\n'));
  const std::size_t line_start = before.rfind('\n');
  const std::size_t column = line_start == std::string_view::npos ? offset + 1 : offset - line_start;
  return fmt::format("line {}, column {} (byte {})", line, column, placement.first_byte + offset);
}

ParsedValue parse_value(std::string_view text, Placement placement) {
  TreeBuilder builder;
  ParsedValue parsed;
  if (Json::sax_parse(text.begin(), text.end(), &builder)) {
    parsed.value = std::move(builder.root);
    return parsed;
  }
  parsed.error = std::move(builder.error);
  if (!parsed.error) parsed.error = DescriptionError{"", "the parser stopped without a reason"};
  if (builder.error_offset) {
    parsed.error->where = position_in(text, *builder.error_offset, placement);
    parsed.syntax_error = true;
  }
  return parsed;
}

bool is_json_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool is_blank(std::string_view text) { return std::all_of(text.begin(), text.end(), is_json_space); }

struct Line {
  std::size_t number;  // 1-based
  std::size_t offset;  // of its first byte in the document
  std::string_view text;
};

// The non-blank line that starts at or after byte `from`, if any.
std::optional<Line> next_non_blank_line(std::string_view document, std::size_t from,
                                        std::size_t number) {
  for (; from <= document.size(); ++number) {
    std::size_t end = document.find('\n', from);
    if (end == std::string_view::npos) end = document.size();
    const std::string_view text = document.substr(from, end - from);
    if (!is_blank(text)) return Line{number, from, text};
    from = end + 1;
  }
  return std::nullopt;
}

// The non-blank line after `line`.
std::optional<Line> next_non_blank_line(std::string_view document, const Line& line) {
  return next_non_blank_line(document, line.offset + line.text.size() + 1, line.number + 1);
}

// `where` of a call's error, prefixed by the call's place in the document.
CallResult located(CallResult result, const std::string& origin, std::string_view separator) {
  if (auto* error = std::get_if<DescriptionError>(&result)) {
    if (error->where.empty())
      error->where = origin;
    else if (!origin.empty())
      error->where = origin + std::string(separator) + error->where;
  }
  return result;
}

// Reads the document and hands every call to `visit(DocumentCall&&)` in document order, one at
// a time, so that `kdaguard check` holds one call in memory, however many the document has (a
// call is kilobytes; a JSON Lines line can be three bytes). Returns the error of the document as
// a whole, if any.
template <class Visit>
std::optional<DescriptionError> read_document(std::string_view text, Visit&& visit) {
  if (is_blank(text)) return DescriptionError{"", "the document is empty: no call to check"};
  ParsedValue whole = parse_value(text, Placement{});
  if (!whole.error) {
    if (whole.value.is_object()) {
      visit(DocumentCall{"", parse_call(whole.value)});
      return std::nullopt;
    }
    if (!whole.value.is_array())
      return DescriptionError{
          "", fmt::format("a document is a call object, an array of calls or JSON Lines; got {}",
                          json_kind(whole.value))};
    if (whole.value.empty()) return DescriptionError{"", "the array holds no call to check"};
    for (std::size_t i = 0; i < whole.value.size(); ++i) {
      std::string origin = fmt::format("/{}", i);
      CallResult call = located(parse_call(whole.value[i]), origin, "");
      visit(DocumentCall{std::move(origin), std::move(call)});
    }
    return std::nullopt;
  }

  // Not one JSON value: JSON Lines, if its first non-blank line is a call object on its own.
  const std::optional<Line> first_line = next_non_blank_line(text, 0, 1);
  const ParsedValue first =
      parse_value(first_line->text, Placement{first_line->offset, first_line->number});
  if (!next_non_blank_line(text, *first_line) || first.error || !first.value.is_object())
    return std::move(whole.error);
  for (std::optional<Line> next = first_line; next; next = next_non_blank_line(text, *next)) {
    const Line& line = *next;
    std::string origin = fmt::format("line {}", line.number);
    ParsedValue parsed = parse_value(line.text, Placement{line.offset, line.number});
    CallResult call = [&]() -> CallResult {
      if (parsed.error) {
        // A syntax error's position already names the line; a duplicate key or too deep nesting
        // is placed by its JSON pointer, which needs the line in front.
        if (parsed.syntax_error) return std::move(*parsed.error);
        return located(std::move(*parsed.error), origin, " ");
      }
      if (!parsed.value.is_object())
        return DescriptionError{origin, fmt::format("JSON Lines hold one call object per line; "
                                                    "got {}", json_kind(parsed.value))};
      return located(parse_call(parsed.value), origin, " ");
    }();
    visit(DocumentCall{std::move(origin), std::move(call)});
  }
  return std::nullopt;
}

}  // namespace

Document parse_document(std::string_view text) {
  Document document;
  document.error = read_document(text, [&](DocumentCall&& call) {
    document.calls.push_back(std::move(call));
  });
  return document;
}

Json verdict_to_json(Entry entry, const Verdict& verdict) {
  Json j = Json::object();
  j["entry"] = std::string(entry_name(entry));
  j["accepted"] = verdict.accepted();
  Json violations = Json::array();
  for (const Violation& violation : verdict.violations) {
    Json v = Json::object();
    v["rule"] = std::string(rule_id(violation.rule));
    v["argument"] = violation.argument;
    v["message"] = violation.message;
    violations.push_back(std::move(v));
  }
  j["violations"] = std::move(violations);
  Json deferred = Json::array();
  for (const DeferredCheck& check : verdict.deferred) {
    Json d = Json::object();
    d["rule"] = std::string(rule_id(check.rule));
    d["argument"] = check.argument;
    deferred.push_back(std::move(d));
  }
  j["deferred"] = std::move(deferred);
  return j;
}

int check_document(std::string_view text, const LineSink& on_verdict, const LineSink& on_problem) {
  try {
    bool malformed = false;
    bool rejected = false;
    const std::optional<DescriptionError> document_error =
        read_document(text, [&](DocumentCall&& item) {
          if (const auto* error = std::get_if<DescriptionError>(&item.call)) {
            malformed = true;
            on_problem(format_error(*error));
            return;
          }
          const CatalogueCall& call = std::get<CatalogueCall>(item.call);
          const Verdict verdict = validate(call);
          rejected = rejected || !verdict.accepted();
          // Messages are the validator's own ASCII; `replace` keeps dump() from throwing anyway.
          on_verdict(verdict_to_json(entry_of(call), verdict)
                         .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
        });
    if (document_error) {
      malformed = true;
      on_problem(format_error(*document_error));
    }
    return malformed ? 2 : rejected ? 1 : 0;
  } catch (const std::exception& exception) {
    on_problem(fmt::format("internal error (a bug of kdaguard, not of the input): {}",
                           shown(exception.what())));
  } catch (...) {
    on_problem("internal error (a bug of kdaguard, not of the input): unknown exception");
  }
  return 2;
}

CheckOutcome check_document(std::string_view text) {
  CheckOutcome outcome;
  outcome.exit_code = check_document(
      text, [&](std::string_view line) { (outcome.out += line) += '\n'; },
      [&](std::string_view line) { (outcome.err += line) += '\n'; });
  return outcome;
}

}  // namespace kdaguard::callio
