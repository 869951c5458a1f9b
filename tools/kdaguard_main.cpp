// kdaguard: the rule catalogue and the checking of call descriptions, on the command line.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <string_view>

#include <CLI/CLI.hpp>

#include "kdaguard/callio.h"

namespace {

constexpr int kExitMalformed = 2;  // also for usage errors and unreadable files: nothing was judged

// The whole input, byte for byte. Plain stdio: it reports a directory or an I/O error through
// errno instead of throwing from deep inside a stream buffer.
bool read_all(const std::string& path, std::string& text, std::string& problem) {
  std::FILE* file = path == "-" ? stdin : std::fopen(path.c_str(), "rb");
  const std::string name = path == "-" ? std::string("standard input") : path;
  if (file == nullptr) {
    problem = "cannot open " + name + ": " + std::strerror(errno);
    return false;
  }
  char buffer[1 << 16];
  std::size_t count = 0;
  while ((count = std::fread(buffer, 1, sizeof buffer, file)) > 0) text.append(buffer, count);
  const bool failed = std::ferror(file) != 0;
  const int error = errno;
  if (file != stdin) std::fclose(file);
  if (failed) {
    problem = "cannot read " + name + ": " + std::strerror(error);
    return false;
  }
  return true;
}

int run(int argc, char** argv) {
  CLI::App app{"kdaguard: the preconditions of the Kimi Delta Attention kernels (decode, prefill, "
               "verify, commit, and the record-based record_verify, replay_commit, accept_verify), "
               "listed and checked.",
               "kdaguard"};
  app.set_version_flag("--version", std::string("kdaguard ") + KDAGUARD_VERSION);
  app.require_subcommand(1);

  CLI::App* rules = app.add_subcommand(
      "rules", "Print the rule catalogue: id, tier, entry points and meaning of every rule.");
  bool as_json = false;
  bool as_markdown = false;
  CLI::Option* json_flag =
      rules->add_flag("--json", as_json, "as JSON: {\"rules\": [{id, tier, entry_points, meaning}]}");
  CLI::Option* markdown_flag =
      rules->add_flag("--markdown", as_markdown, "as a Markdown table (the README's rule table)");
  json_flag->excludes(markdown_flag);

  CLI::App* check = app.add_subcommand(
      "check", "Judge call descriptions (JSON, see call-format.md): one verdict per call, as one "
               "line of JSON on standard output.");
  std::string path;
  check->add_option("FILE", path, "a call object, a JSON array of calls, or JSON Lines; - reads "
                                  "standard input")
      ->required();
  check->footer(
      "Exit status: 0 every call accepted; 1 some call rejected; 2 the description itself is\n"
      "malformed (bad JSON, unknown field, wrong type), with a message on standard error that says\n"
      "where. When one call of many is malformed, the others are still judged and printed, and\n"
      "the exit status is 2.");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    const int code = app.exit(error);  // prints help, the version, or the usage error
    return code == 0 ? 0 : kExitMalformed;
  }

  if (*rules) {
    std::cout << (as_json ? kdaguard::callio::rules_json()
                  : as_markdown ? kdaguard::callio::rules_markdown()
                                : kdaguard::callio::rules_text());
    return 0;
  }

  const std::string source = path == "-" ? std::string("<stdin>") : path;
  std::string text;
  std::string problem;
  if (!read_all(path, text, problem)) {
    std::cerr << "kdaguard check: " << problem << "\n";
    return kExitMalformed;
  }
  // Verdicts go out as they come (std::cout is buffered); problems are prefixed with the input's
  // name, the way compilers name their file, and written in batches (std::cerr is not buffered).
  std::string problems;
  const auto flush_problems = [&] {
    std::cerr << problems << std::flush;
    problems.clear();
  };
  const int exit_code = kdaguard::callio::check_document(
      text, [](std::string_view line) { std::cout << line << '\n'; },
      [&](std::string_view line) {
        ((problems += source) += ": ") += line;
        problems += '\n';
        if (problems.size() > 1 << 16) flush_problems();
      });
  std::cout << std::flush;
  flush_problems();
  return exit_code;
}

}  // namespace

int main(int argc, char** argv) {
  // check_document never throws; this net is for the rest (memory exhausted reading a file, ...).
  try {
    return run(argc, argv);
  } catch (const std::exception& exception) {
    std::cerr << "kdaguard: internal error: " << exception.what() << "\n";
  }
  return kExitMalformed;
}
