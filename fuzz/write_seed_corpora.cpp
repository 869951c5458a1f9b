// Writes the seed corpora: corpus/fuzz_contracts, corpus/fuzz_check_json, corpus/fuzz_reference.
//   fuzz_seed_writer <corpus root>
// Byte-driven targets get inputs recorded from the targets' own drawing code (RecordingChooser),
// so each seed means what its name says: a valid call of each entry point, every catalogue
// mutation on every entry point it applies to (the seeds' scenarios among them: a permuted verify
// row map, a transposed or misaligned state pool, a prefill without its pool, a short gate), and
// edited calls. fuzz_check_json gets the same calls as JSON documents (one call, arrays, JSON
// Lines) plus malformed ones. Deterministic: the same tree every run.
#include <fmt/format.h>

#include <cstdint>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "contracts_case.h"
#include "fuzz_chooser.h"
#include "kdaguard/callio.h"
#include "reference_case.h"

namespace kdaguard::support {
namespace {

namespace fs = std::filesystem;

// Answers its first picks from a script (clamped into range), then from `rest`.
class ScriptedChooser final : public Chooser {
 public:
  ScriptedChooser(std::deque<std::int64_t> script, Chooser& rest) : script_(std::move(script)), rest_(rest) {}
  std::int64_t pick(std::int64_t lo, std::int64_t hi) override {
    if (script_.empty()) return rest_.pick(lo, hi);
    const std::int64_t v = std::clamp(script_.front(), lo, std::max(lo, hi));
    script_.pop_front();
    return v;
  }

 private:
  std::deque<std::int64_t> script_;
  Chooser& rest_;
};

void write_file(const fs::path& path, const std::vector<std::uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}
void write_file(const fs::path& path, const std::string& text) {
  write_file(path, std::vector<std::uint8_t>(text.begin(), text.end()));
}

std::string file_name(std::string_view text) {
  std::string name;
  for (char ch : text) name += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
  return name;
}

constexpr Entry kEntries[] = {Entry::decode, Entry::prefill, Entry::verify, Entry::commit};

// A recorded fuzz_contracts input for (entry, mutation or none, no edits or some), found by
// trying seeds in order until the drawn case is the one wanted.
std::vector<std::uint8_t> contracts_input(std::size_t entry, std::int64_t mutation, bool edits,
                                          std::uint64_t& seed, ContractsCase* drawn) {
  for (;; ++seed) {
    SeededChooser random(seed);
    ScriptedChooser scripted({static_cast<std::int64_t>(entry), mutation}, random);
    RecordingChooser record(scripted);
    ContractsCase c = draw_contracts_case(record);
    if ((c.edits > 0) != edits) continue;
    // Check the bytes replay to the same case.
    const auto bytes = record.bytes();
    FuzzedDataProvider data(bytes.data(), bytes.size());
    FuzzChooser replay(data);
    const ContractsCase again = draw_contracts_case(replay);
    if (describe_call(again.call.call) != describe_call(c.call.call)) {
      std::fprintf(stderr, "seed writer: recorded input does not replay\n");
      std::exit(1);
    }
    if (drawn) *drawn = std::move(c);
    return bytes;
  }
}

void write_contracts(const fs::path& dir, std::vector<AnyCall>& json_calls) {
  fs::create_directories(dir);
  std::uint64_t seed = 1;
  int files = 0;
  for (std::size_t e = 0; e < std::size(kEntries); ++e) {
    for (int i = 0; i < 4; ++i) {
      ContractsCase c;
      write_file(dir / fmt::format("valid_{}_{}", entry_name(kEntries[e]), i),
                 contracts_input(e, -1, false, ++seed, &c));
      json_calls.push_back(c.call.call);
      ++files;
    }
    for (int i = 0; i < 3; ++i) {
      write_file(dir / fmt::format("edited_{}_{}", entry_name(kEntries[e]), i),
                 contracts_input(e, -1, true, ++seed, nullptr));
      ++files;
    }
  }
  const auto table = mutation_table();
  for (std::size_t m = 0; m < table.size(); ++m) {
    for (std::size_t e = 0; e < std::size(kEntries); ++e) {
      if (!table[m].applies_to(kEntries[e])) continue;
      ContractsCase c;
      const auto bytes = contracts_input(e, static_cast<std::int64_t>(m), false, ++seed, &c);
      write_file(dir / fmt::format("{}_{}_{}", rule_id(table[m].rule), entry_name(kEntries[e]),
                                   file_name(table[m].name)),
                 bytes);
      json_calls.push_back(c.call.call);
      ++files;
    }
  }
  std::printf("%s: %d inputs\n", dir.string().c_str(), files);
}

void write_check_json(const fs::path& dir, const std::vector<AnyCall>& calls) {
  fs::create_directories(dir);
  int files = 0;
  for (std::size_t i = 0; i < calls.size(); ++i) {
    write_file(dir / fmt::format("call_{:03}_{}.json", i, entry_name(entry_of(calls[i]))),
               callio::call_to_json(calls[i]).dump(1) + "\n");
    ++files;
  }
  // Documents of several calls: an array and JSON Lines.
  callio::Json array = callio::Json::array();
  std::string lines;
  for (std::size_t i = 0; i < calls.size() && i < 6; ++i) {
    array.push_back(callio::call_to_json(calls[i]));
    lines += callio::call_to_json(calls[i]).dump() + "\n";
  }
  write_file(dir / "document_array.json", array.dump() + "\n");
  write_file(dir / "document_lines.jsonl", lines);
  // Malformed: truncated, an unknown field, a wrong type, deep nesting, not JSON at all.
  const std::string one = callio::call_to_json(calls.front()).dump();
  write_file(dir / "malformed_truncated.json", one.substr(0, one.size() / 2));
  write_file(dir / "malformed_unknown_field.json",
             R"({"entry": "decode", "tensors": {"q": {"dtype": "bf16", "shape": [1, 1, 64], "strides": [64, 64, 1]}}})");
  write_file(dir / "malformed_wrong_type.json", R"({"entry": "verify", "tensors": {}, "scalars": {"draft_token_num": "four"}})");
  write_file(dir / "malformed_deep.json", std::string(200, '[') + std::string(200, ']'));
  write_file(dir / "malformed_not_json.txt", std::string("entry=decode q=bf16[4,32,128]\n"));
  files += 7;
  std::printf("%s: %d inputs\n", dir.string().c_str(), files);
}

void write_reference(const fs::path& dir) {
  fs::create_directories(dir);
  int files = 0;
  // Entry (prefill, verify, commit), then a few distinct problems each.
  for (std::int64_t entry = 0; entry < 3; ++entry) {
    for (std::uint64_t seed = 1; seed <= 6; ++seed) {
      SeededChooser random(seed * 7919 + static_cast<std::uint64_t>(entry));
      ScriptedChooser scripted({entry}, random);
      RecordingChooser record(scripted);
      const ReferenceCase c = draw_reference_case(record);
      write_file(dir / fmt::format("{}_{}", entry_name(c.spec.entry), seed), record.bytes());
      ++files;
    }
  }
  std::printf("%s: %d inputs\n", dir.string().c_str(), files);
}

}  // namespace
}  // namespace kdaguard::support

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <corpus root>\n", argv[0]);
    return 2;
  }
  namespace fs = std::filesystem;
  using namespace kdaguard::support;
  const fs::path root(argv[1]);
  std::vector<kdaguard::AnyCall> calls;
  write_contracts(root / "fuzz_contracts", calls);
  write_check_json(root / "fuzz_check_json", calls);
  write_reference(root / "fuzz_reference");
  return 0;
}
