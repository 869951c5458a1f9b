// The `kdaguard` binary end to end: the corpus judged as corpus/calls/EXPECTED.tsv says, random
// input through the real process, the rule listings, --help and --version, and the README's rule
// table in sync with `kdaguard rules --markdown`.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "kdaguard/callio.h"
#include "spec_rule_ids.h"
#include "random_calls.h"

namespace kdaguard::callio {
namespace {

namespace fs = std::filesystem;
using testing_support::Random;

std::string read_file(const fs::path& path) {
  std::ifstream file(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>()};
}

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  std::string part;
  std::istringstream stream(text);
  while (std::getline(stream, part, separator)) parts.push_back(part);
  return parts;
}

struct Process {
  int exit_code = -1;
  std::string out;
  std::string err;
};

// Runs `kdaguard <arguments>` (arguments are shell words without quotes), stdin from a file.
Process kdaguard(const std::string& arguments, const std::string& stdin_path = "/dev/null") {
  const fs::path dir = fs::temp_directory_path();
  const std::string stem = fmt::format("kdaguard_cli_test_{}", ::getpid());
  const fs::path out = dir / (stem + ".out");
  const fs::path err = dir / (stem + ".err");
  const std::string command = fmt::format("'{}' {} <'{}' >'{}' 2>'{}'", KDAGUARD_BINARY, arguments,
                                          stdin_path, out.string(), err.string());
  const int status = std::system(command.c_str());
  Process run;
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  run.out = read_file(out);
  run.err = read_file(err);
  fs::remove(out);
  fs::remove(err);
  return run;
}

// ---- the corpus ----

struct Expectation {
  std::string file;
  int exit_code;
  std::vector<std::set<std::string>> violations;  // one set of rule ids per verdict line
  std::vector<std::set<std::string>> deferred;
};

std::vector<std::set<std::string>> rule_groups(const std::string& column) {
  std::vector<std::set<std::string>> groups;
  if (column == "(none)") return groups;
  for (const std::string& group : split(column, ';')) {
    std::set<std::string> rules;
    if (group != "-")
      for (const std::string& id : split(group, ',')) rules.insert(id);
    groups.push_back(rules);
  }
  return groups;
}

std::vector<Expectation> read_manifest() {
  std::vector<Expectation> rows;
  std::istringstream manifest(read_file(fs::path(KDAGUARD_CORPUS_DIR) / "EXPECTED.tsv"));
  for (std::string line; std::getline(manifest, line);) {
    if (line.empty() || line[0] == '#') continue;
    const std::vector<std::string> columns = split(line, '\t');
    if (columns.size() != 4) {
      ADD_FAILURE() << "EXPECTED.tsv: not 4 tab-separated columns: " << line;
      continue;
    }
    rows.push_back(Expectation{columns[0], std::stoi(columns[1]), rule_groups(columns[2]),
                               rule_groups(columns[3])});
  }
  return rows;
}

std::set<std::string> rules_in(const Json& items) {
  std::set<std::string> rules;
  for (const Json& item : items) rules.insert(item.at("rule").get<std::string>());
  return rules;
}

TEST(Corpus, ManifestCoversEveryFile) {
  std::set<std::string> listed;
  for (const Expectation& row : read_manifest())
    EXPECT_TRUE(listed.insert(row.file).second) << row.file << " is listed twice";
  std::set<std::string> present;
  for (const auto& entry : fs::directory_iterator(KDAGUARD_CORPUS_DIR)) {
    const std::string extension = entry.path().extension().string();
    if (extension == ".json" || extension == ".jsonl") present.insert(entry.path().filename().string());
  }
  EXPECT_EQ(listed, present);
}

TEST(Corpus, EveryFileIsJudgedAsExpected) {
  const std::vector<Expectation> rows = read_manifest();
  ASSERT_FALSE(rows.empty());
  for (const Expectation& row : rows) {
    SCOPED_TRACE(row.file);
    const Process run = kdaguard(fmt::format("check '{}/{}'", KDAGUARD_CORPUS_DIR, row.file));
    EXPECT_EQ(run.exit_code, row.exit_code) << run.out << run.err;
    std::vector<std::set<std::string>> violations, deferred;
    for (const std::string& line : split(run.out, '\n')) {
      if (line.empty()) continue;
      const Json verdict = Json::parse(line);
      violations.push_back(rules_in(verdict.at("violations")));
      deferred.push_back(rules_in(verdict.at("deferred")));
    }
    EXPECT_EQ(violations, row.violations) << run.out;
    EXPECT_EQ(deferred, row.deferred) << run.out;
    // Malformed descriptions say which file and where; judged ones say nothing on stderr.
    if (row.exit_code == 2)
      EXPECT_NE(run.err.find(row.file + ": "), std::string::npos) << run.err;
    else
      EXPECT_EQ(run.err, "");
  }
}

TEST(Corpus, SeedRulesCarryTheSeedText) {
  const std::vector<std::pair<std::string, std::string>> seeds = {
      {"bad_state_transposed.json", "state inner strides must be compact (V*K, K, 1)"},
      {"bad_prefill_without_initial_state.json", "KDA prefill requires an indexed initial-state pool"},
      {"bad_prefill_gate_shorter_than_q.json", "g and beta must cover every q token"},
      {"bad_verify_permuted_row_map.json", "requires an identity intermediate row-map"},
      {"bad_verify_more_draft_tokens_than_scratch_steps.json",
       "KDA verify needs 5 scratch steps, but intermediate_ssm only has 4."}};
  for (const auto& [file, text] : seeds) {
    const Process run = kdaguard(fmt::format("check '{}/{}'", KDAGUARD_CORPUS_DIR, file));
    EXPECT_NE(run.out.find(text), std::string::npos) << file << ": " << run.out;
  }
}

// ---- check: stdin, unreadable files, random input through the real process ----

TEST(Check, ReadsStandardInput) {
  const fs::path file = fs::path(KDAGUARD_CORPUS_DIR) / "bad_verify_permuted_row_map.json";
  const Process run = kdaguard("check -", file.string());
  const CheckOutcome expected = check_document(read_file(file));
  EXPECT_EQ(run.exit_code, 1);
  EXPECT_EQ(run.out, expected.out);
}

TEST(Check, UnreadableInputIsExit2) {
  const Process run = kdaguard("check /nonexistent/calls.json");
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_NE(run.err.find("cannot open /nonexistent/calls.json"), std::string::npos) << run.err;
  const Process directory = kdaguard(fmt::format("check '{}'", KDAGUARD_CORPUS_DIR));
  EXPECT_EQ(directory.exit_code, 2);
  EXPECT_NE(directory.err.find("cannot read"), std::string::npos) << directory.err;
  EXPECT_EQ(kdaguard("check").exit_code, 2);  // FILE is required
  EXPECT_EQ(kdaguard("check a.json b.json").exit_code, 2);
  EXPECT_EQ(kdaguard("").exit_code, 2);  // a subcommand is required
}

TEST(Check, RandomInputThroughTheBinaryMatchesTheLibrary) {
  const std::uint64_t seed = testing_support::test_seed();
  SCOPED_TRACE(fmt::format("KDAGUARD_TEST_SEED={}", seed));
  Random random(seed);
  const std::string corpus = read_file(fs::path(KDAGUARD_CORPUS_DIR) / "good_verify_identity_row_map.json");
  const fs::path input = fs::temp_directory_path() / fmt::format("kdaguard_cli_input_{}", ::getpid());
  for (int i = 0; i < 50; ++i) {
    const std::string bytes = i % 3 == 0   ? random_bytes(random)
                              : i % 3 == 1 ? random_token_soup(random)
                                           : mutated(random, corpus);
    std::ofstream(input, std::ios::binary) << bytes;
    const Process run = kdaguard(fmt::format("check '{}'", input.string()));
    const CheckOutcome expected = check_document(bytes);
    ASSERT_EQ(run.exit_code, expected.exit_code) << bytes;
    ASSERT_EQ(run.out, expected.out) << bytes;
    std::string prefixed;
    for (const std::string& line : split(expected.err, '\n'))
      if (!line.empty()) prefixed += input.string() + ": " + line + "\n";
    ASSERT_EQ(run.err, prefixed) << bytes;
  }
  fs::remove(input);
}

// ---- rules ----

TEST(Rules, JsonListsTheWholeCatalogue) {
  const Process run = kdaguard("rules --json");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const Json listing = Json::parse(run.out);
  const Json& rules = listing.at("rules");
  const auto catalogue = rule_catalogue();
  ASSERT_EQ(rules.size(), catalogue.size());
  std::set<std::string> ids;
  for (std::size_t i = 0; i < catalogue.size(); ++i) {
    const RuleInfo& info = catalogue[i];
    const Json& rule = rules[i];
    EXPECT_EQ(rule.at("id"), std::string(info.id));
    EXPECT_EQ(rule.at("tier"), std::string(tier_name(info.tier)));
    EXPECT_EQ(rule.at("meaning"), std::string(info.meaning));
    std::vector<std::string> entries;
    for (int e = 0; e < kEntryCount; ++e)
      if (info.applies_to(static_cast<Entry>(e))) entries.emplace_back(entry_name(static_cast<Entry>(e)));
    EXPECT_EQ(rule.at("entry_points").get<std::vector<std::string>>(), entries) << info.id;
    ids.insert(rule.at("id").get<std::string>());
  }
  EXPECT_EQ(ids.size(), rules.size()) << "an id is listed twice";
  for (std::string_view id : kSpecRuleIds)
    EXPECT_TRUE(ids.count(std::string(id))) << id << " is missing";
}

TEST(Rules, TextAndMarkdownHaveARowPerRule) {
  const Process text = kdaguard("rules");
  ASSERT_EQ(text.exit_code, 0);
  const Process markdown = kdaguard("rules --markdown");
  ASSERT_EQ(markdown.exit_code, 0);
  const std::vector<std::string> text_lines = split(text.out, '\n');
  const std::vector<std::string> markdown_lines = split(markdown.out, '\n');
  const auto catalogue = rule_catalogue();
  ASSERT_EQ(text_lines.size(), catalogue.size() + 1);      // a header
  ASSERT_EQ(markdown_lines.size(), catalogue.size() + 2);  // a header and its rule
  const std::size_t meaning_column = text_lines[0].find("meaning");
  for (std::size_t i = 0; i < catalogue.size(); ++i) {
    EXPECT_EQ(text_lines[i + 1].rfind(std::string(catalogue[i].id) + " ", 0), 0u) << text_lines[i + 1];
    EXPECT_EQ(text_lines[i + 1].substr(meaning_column), catalogue[i].meaning);  // aligned
    EXPECT_EQ(markdown_lines[i + 2].rfind(fmt::format("| `{}` | ", catalogue[i].id), 0), 0u);
  }
  EXPECT_EQ(kdaguard("rules --json --markdown").exit_code, 2);
}

// ---- help and version ----

TEST(Command, HelpOnEverySubcommandAndVersion) {
  for (const std::string arguments : {"--help", "rules --help", "check --help", "-h", "rules -h"}) {
    const Process run = kdaguard(arguments);
    EXPECT_EQ(run.exit_code, 0) << arguments;
    EXPECT_NE(run.out.find("Usage:"), std::string::npos) << arguments << ": " << run.out;
  }
  EXPECT_NE(kdaguard("check --help").out.find("Exit status"), std::string::npos);
  const Process version = kdaguard("--version");
  EXPECT_EQ(version.exit_code, 0);
  EXPECT_EQ(version.out, fmt::format("kdaguard {}\n", KDAGUARD_PROJECT_VERSION));
}

// ---- the README's rule table ----

TEST(ReadmeRules, readme_rules_in_sync) {
  const std::string readme = read_file(KDAGUARD_README);
  ASSERT_FALSE(readme.empty()) << KDAGUARD_README << " is missing";
  const std::string begin = "<!-- rules:begin -->\n";
  const std::string end = "<!-- rules:end -->";
  const std::size_t from = readme.find(begin);
  const std::size_t to = readme.find(end);
  ASSERT_NE(from, std::string::npos) << "no " << begin << "marker in the README";
  ASSERT_NE(to, std::string::npos) << "no " << end << " marker in the README";
  ASSERT_LT(from, to);
  const std::string block = readme.substr(from + begin.size(), to - from - begin.size());
  const Process markdown = kdaguard("rules --markdown");
  ASSERT_EQ(markdown.exit_code, 0);
  EXPECT_EQ(block, markdown.out)
      << "The README's rule table is stale: run scripts/update_readme_rules.sh <build dir>";
}

}  // namespace
}  // namespace kdaguard::callio
