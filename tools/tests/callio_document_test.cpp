// Documents (one call, an array, JSON Lines), check_document's verdicts and exit codes, and its
// robustness against any bytes.
#include <chrono>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "kdaguard/callio.h"
#include "random_calls.h"

namespace kdaguard::callio {
namespace {

using testing_support::Random;

std::string corpus_file(const std::string& name) {
  std::ifstream file(std::string(KDAGUARD_CORPUS_DIR) + "/" + name, std::ios::binary);
  EXPECT_TRUE(file.good()) << name;
  return {std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>()};
}

// The corpus' accepted decode call on one line, and a call that is rejected (no tensors at all).
std::string accepted_call() { return Json::parse(corpus_file("good_decode_packed_qkv.json")).dump(); }
const std::string kRejectedCall = R"({"entry": "prefill"})";

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream stream(text);
  for (std::string line; std::getline(stream, line);) lines.push_back(line);
  return lines;
}

std::vector<Json> verdicts_of(const CheckOutcome& outcome) {
  std::vector<Json> verdicts;
  for (const std::string& line : lines_of(outcome.out)) verdicts.push_back(Json::parse(line));
  return verdicts;
}

TEST(Document, OneCall) {
  const Document document = parse_document(accepted_call());
  ASSERT_FALSE(document.error);
  ASSERT_EQ(document.calls.size(), 1u);
  EXPECT_EQ(document.calls[0].origin, "");
  EXPECT_TRUE(std::holds_alternative<CatalogueCall>(document.calls[0].call));
}

TEST(Document, ArrayOfCalls) {
  const Document document = parse_document(fmt::format("[{},\n{}]", accepted_call(), kRejectedCall));
  ASSERT_FALSE(document.error);
  ASSERT_EQ(document.calls.size(), 2u);
  EXPECT_EQ(document.calls[1].origin, "/1");
  EXPECT_EQ(entry_of(std::get<CatalogueCall>(document.calls[1].call)), Entry::prefill);
}

TEST(Document, JsonLinesSkipBlankLinesAndCarriageReturns) {
  const std::string text =
      fmt::format("\n{}\r\n  \t\n{}\r\n\n", accepted_call(), kRejectedCall);
  const Document document = parse_document(text);
  ASSERT_FALSE(document.error) << format_error(*document.error);
  ASSERT_EQ(document.calls.size(), 2u);
  EXPECT_EQ(document.calls[0].origin, "line 2");
  EXPECT_EQ(document.calls[1].origin, "line 4");
}

TEST(Document, MalformedLineIsPlacedAndTheOthersRead) {
  const std::string text = kRejectedCall + "\n" + R"({"entry": "decode", "tensors": {"q": 1}})" +
                           "\n{\"entry\": \n" + kRejectedCall + "\n[1]\n";
  const Document document = parse_document(text);
  ASSERT_FALSE(document.error);
  ASSERT_EQ(document.calls.size(), 5u);
  EXPECT_TRUE(std::holds_alternative<CatalogueCall>(document.calls[0].call));
  EXPECT_EQ(std::get<DescriptionError>(document.calls[1].call).where, "line 2 /tensors/q");
  const DescriptionError& syntax = std::get<DescriptionError>(document.calls[2].call);
  EXPECT_EQ(syntax.where.rfind("line 3, column ", 0), 0u) << syntax.where;
  EXPECT_TRUE(std::holds_alternative<CatalogueCall>(document.calls[3].call));
  EXPECT_EQ(std::get<DescriptionError>(document.calls[4].call).where, "line 5");
}

TEST(Document, SyntaxErrorSaysLineColumnAndByte) {
  const Document document = parse_document("{\n  \"entry\": \"decode\",\n  \"tensors\": {,}\n}");
  ASSERT_TRUE(document.error);
  EXPECT_EQ(document.error->where, "line 3, column 15 (byte 37)");
  EXPECT_NE(document.error->message.find("syntax error"), std::string::npos);
}

TEST(Document, InvalidUtf8IsASyntaxErrorShownEscaped) {
  const Document document = parse_document("{\"entry\": \"dec\xff\xfeode\"}");
  ASSERT_TRUE(document.error);
  EXPECT_EQ(document.error->where, "line 1, column 15 (byte 14)");
  for (const char c : format_error(*document.error))
    EXPECT_TRUE(c >= 0x20 && c < 0x7f) << "unescaped byte in " << format_error(*document.error);
}

TEST(Document, NestingIsBounded) {
  for (const std::size_t depth : {std::size_t{65}, std::size_t{100000}}) {
    const std::string text = R"({"entry": "decode", "tensors": )" + std::string(depth, '[') +
                             std::string(depth, ']') + "}";
    const Document document = parse_document(text);
    ASSERT_TRUE(document.error);
    EXPECT_NE(document.error->message.find("nesting deeper than 64 levels"), std::string::npos);
    EXPECT_EQ(document.error->where.rfind("/tensors/0/0/0/", 0), 0u) << document.error->where;
  }
  // 64 levels are read (and then refused by the call's structure, not by depth).
  const std::string deep = R"({"entry": "decode", "tensors": )" + std::string(63, '[') +
                           std::string(63, ']') + "}";
  const Document document = parse_document(deep);
  ASSERT_FALSE(document.error) << format_error(*document.error);
  EXPECT_EQ(std::get<DescriptionError>(document.calls.at(0).call).where, "/tensors");
}

// Big inputs are read in linear time: an object of 100k members, 100k malformed lines. (Done
// naively, both take tens of seconds: ordered_json looks keys up linearly, and a position counted
// from the start of the document costs the whole document per line.)
TEST(Document, BigInputsStayLinear) {
  std::string members = "{";
  for (int i = 0; i < 100000; ++i) members += fmt::format("\"k{}\": [{}], ", i, i);
  members += R"("entry": "decode"})";
  std::string lines = kRejectedCall + "\n";
  for (int i = 0; i < 100000; ++i) lines += "{x\n";
  const auto start = std::chrono::steady_clock::now();
  const CheckOutcome object = check_document(members);
  const CheckOutcome jsonl = check_document(lines);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(object.err, "/k0: unknown field 'k0' (a call has entry, device, tensors, scalars)\n");
  EXPECT_EQ(jsonl.exit_code, 2);
  EXPECT_EQ(lines_of(jsonl.err).size(), 100000u);
  EXPECT_EQ(lines_of(jsonl.err).back().rfind("line 100001, column 2 (byte ", 0), 0u);
  EXPECT_LT(seconds, 10.0);
}

TEST(Document, NoCallIsAnError) {
  for (const std::string text : {"", " \n\t\r\n", "[]", "42", "\"decode\"", "null",
                                 "{} {}", "[{\"entry\": \"decode\"}] x"}) {
    const Document document = parse_document(text);
    EXPECT_TRUE(document.error) << text;
    EXPECT_TRUE(document.calls.empty()) << text;
  }
}

TEST(Check, ExitCodesAndVerdicts) {
  const CheckOutcome accepted = check_document(accepted_call());
  EXPECT_EQ(accepted.exit_code, 0);
  EXPECT_EQ(accepted.err, "");
  ASSERT_EQ(verdicts_of(accepted).size(), 1u);
  EXPECT_EQ(verdicts_of(accepted)[0]["accepted"], true);

  const CheckOutcome rejected = check_document(accepted_call() + "\n" + kRejectedCall + "\n");
  EXPECT_EQ(rejected.exit_code, 1);
  EXPECT_EQ(rejected.err, "");
  const std::vector<Json> verdicts = verdicts_of(rejected);
  ASSERT_EQ(verdicts.size(), 2u);
  EXPECT_EQ(verdicts[1]["entry"], "prefill");
  EXPECT_EQ(verdicts[1]["accepted"], false);
  EXPECT_FALSE(verdicts[1]["violations"].empty());

  // One malformed call of three: the other two are judged and printed, and the exit is 2.
  const CheckOutcome mixed = check_document(
      fmt::format(R"([{}, {{"entry": "decode", "tensors": {{"q": {{"dtype": "f64"}}}}}}, {}])",
                  kRejectedCall, accepted_call()));
  EXPECT_EQ(mixed.exit_code, 2);
  ASSERT_EQ(verdicts_of(mixed).size(), 2u);
  EXPECT_EQ(verdicts_of(mixed)[0]["accepted"], false);
  EXPECT_EQ(verdicts_of(mixed)[1]["accepted"], true);
  EXPECT_EQ(mixed.err, "/1/tensors/q/dtype: unknown dtype 'f64' (f32, f16, bf16, i32, i64)\n");
}

TEST(Check, IsAPureFunctionOfTheText) {
  const std::string text = fmt::format("[{},{}]", accepted_call(), kRejectedCall);
  const CheckOutcome first = check_document(text);
  const CheckOutcome second = check_document(text);
  EXPECT_EQ(first.exit_code, second.exit_code);
  EXPECT_EQ(first.out, second.out);
  EXPECT_EQ(first.err, second.err);
}

TEST(Check, StreamedFormGivesTheSameLines) {
  const std::string text = kRejectedCall + "\n{\"entry\": 1}\n" + accepted_call() + "\n";
  const CheckOutcome collected = check_document(text);
  std::vector<std::string> verdicts, problems;
  const int exit_code = check_document(
      text, [&](std::string_view line) { verdicts.emplace_back(line); },
      [&](std::string_view line) { problems.emplace_back(line); });
  EXPECT_EQ(exit_code, 2);
  EXPECT_EQ(exit_code, collected.exit_code);
  EXPECT_EQ(verdicts, lines_of(collected.out));
  EXPECT_EQ(problems, lines_of(collected.err));
  EXPECT_EQ(problems, std::vector<std::string>{"line 2 /entry: expected a string, got an integer"});
  EXPECT_EQ(verdicts.size(), 2u);
}

// verdict_to_json in exactly the shape call-format.md prints.
TEST(Check, VerdictShape) {
  Verdict verdict;
  verdict.violations.push_back({RuleId::state_inner_strides, "state", "inner strides \"x\""});
  verdict.deferred.push_back({RuleId::index_range, "cache_indices"});
  EXPECT_EQ(verdict_to_json(Entry::decode, verdict).dump(),
            R"({"entry":"decode","accepted":false,"violations":[{"rule":"state.inner_strides",)"
            R"("argument":"state","message":"inner strides \"x\""}],"deferred":[{"rule":)"
            R"("index.range","argument":"cache_indices"}]})");
  EXPECT_EQ(verdict_to_json(Entry::commit, Verdict{}).dump(),
            R"({"entry":"commit","accepted":true,"violations":[],"deferred":[]})");
}

// What any input must give: an exit code of 0, 1 or 2; a message for every malformed part; a
// well-formed verdict line per judged call, consistent with the exit code.
void expect_sound_outcome(const std::string& input) {
  const CheckOutcome outcome = check_document(input);
  ASSERT_TRUE(outcome.exit_code == 0 || outcome.exit_code == 1 || outcome.exit_code == 2);
  ASSERT_EQ(outcome.err.rfind("internal error", 0), std::string::npos) << outcome.err;
  ASSERT_EQ(outcome.exit_code == 2, !outcome.err.empty()) << outcome.err;
  bool any_rejected = false;
  for (const std::string& line : lines_of(outcome.out)) {
    const Json verdict = Json::parse(line, nullptr, false);
    ASSERT_TRUE(verdict.is_object()) << line;
    ASSERT_EQ(verdict.size(), 4u) << line;
    ASSERT_TRUE(verdict["entry"].is_string() && verdict["accepted"].is_boolean()) << line;
    ASSERT_TRUE(verdict["violations"].is_array() && verdict["deferred"].is_array()) << line;
    ASSERT_EQ(verdict["accepted"].get<bool>(), verdict["violations"].empty()) << line;
    any_rejected = any_rejected || !verdict["accepted"].get<bool>();
  }
  if (outcome.exit_code == 0) {
    ASSERT_FALSE(any_rejected);
  }
  if (outcome.exit_code == 1) {
    ASSERT_TRUE(any_rejected);
  }
  if (outcome.exit_code != 2) {
    ASSERT_FALSE(outcome.out.empty());
  }
}

TEST(CheckRobustness, RandomBytes) {
  const std::uint64_t seed = testing_support::test_seed();
  SCOPED_TRACE(fmt::format("KDAGUARD_TEST_SEED={}", seed));
  Random random(seed);
  for (int i = 0; i < 1000; ++i) ASSERT_NO_FATAL_FAILURE(expect_sound_outcome(random_bytes(random)));
  for (int i = 0; i < 1000; ++i)
    ASSERT_NO_FATAL_FAILURE(expect_sound_outcome(random_token_soup(random)));
}

TEST(CheckRobustness, MutatedValidDocuments) {
  const std::uint64_t seed = testing_support::test_seed();
  SCOPED_TRACE(fmt::format("KDAGUARD_TEST_SEED={}", seed));
  Random random(seed);
  const std::vector<std::string> documents = {
      corpus_file("good_decode_packed_qkv.json"), corpus_file("good_verify_identity_row_map.json"),
      corpus_file("good_prefill_varlen.json"), corpus_file("good_commit.json"),
      corpus_file("bad_verify_permuted_row_map_after_identity.jsonl"),
      corpus_file("malformed_second_of_three_calls.json")};
  for (int i = 0; i < 1000; ++i) {
    const std::string input = mutated(random, random.pick(documents));
    ASSERT_NO_FATAL_FAILURE(expect_sound_outcome(input)) << input;
  }
  // Random calls written out as JSON, then mutated: deeper into the reader than byte noise gets.
  for (int i = 0; i < 1000; ++i) {
    const std::string input = mutated(random, call_to_json(random_call(random)).dump());
    ASSERT_NO_FATAL_FAILURE(expect_sound_outcome(input)) << input;
  }
}

}  // namespace
}  // namespace kdaguard::callio
