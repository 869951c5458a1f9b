// Writes the seed corpora: corpus/fuzz_contracts, corpus/fuzz_check_json, corpus/fuzz_reference,
// corpus/fuzz_gpu, corpus/fuzz_records.
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
#include <functional>
#include <string>
#include <vector>

#include "contracts_case.h"
#include "fuzz_chooser.h"
#include "gpu_case.h"
#include "kdaguard/callio.h"
#include "records_case.h"
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

// A call for the JSON corpus and the name its file gets.
using NamedCall = std::pair<std::string, AnyCall>;

constexpr Entry kEntries[] = {Entry::decode, Entry::prefill, Entry::verify, Entry::commit};

// A recorded fuzz_contracts input for (entry, mutation or none, no edits or some), found by
// trying seeds in order until the drawn case is the one wanted.
template <class Wanted>
std::vector<std::uint8_t> contracts_input(std::size_t entry, std::int64_t mutation, bool edits,
                                          std::uint64_t& seed, ContractsCase* drawn, Wanted wanted) {
  for (;; ++seed) {
    SeededChooser random(seed);
    ScriptedChooser scripted({static_cast<std::int64_t>(entry), mutation}, random);
    RecordingChooser record(scripted);
    ContractsCase c = draw_contracts_case(record);
    if ((c.edits > 0) != edits || !wanted(c.call)) continue;
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
std::vector<std::uint8_t> contracts_input(std::size_t entry, std::int64_t mutation, bool edits,
                                          std::uint64_t& seed, ContractsCase* drawn) {
  return contracts_input(entry, mutation, edits, seed, drawn, [](const GeneratedCall&) { return true; });
}

std::int64_t mutation_index(std::string_view name) {
  const auto table = mutation_table();
  for (std::size_t m = 0; m < table.size(); ++m)
    if (table[m].name == name) return static_cast<std::int64_t>(m);
  std::fprintf(stderr, "seed writer: no mutation \"%.*s\"\n", static_cast<int>(name.size()), name.data());
  std::exit(1);
}

const TensorView& arg_of(const GeneratedCall& g, Arg a) { return **find_argument(g.call, a); }
bool has_arg(const GeneratedCall& g, Arg a) {
  const OptionalView* v = find_argument(g.call, a);
  return v && v->has_value();
}

// The three seeds' scenarios (shared/seeds), each as the call that upstream hit.
void write_seed_scenarios(const fs::path& dir, std::uint64_t& seed, std::vector<NamedCall>& json_calls) {
  struct Scenario {
    const char* file;
    std::size_t entry;  // index into kEntries
    std::int64_t mutation;
    std::function<bool(const GeneratedCall&)> wanted;
  };
  const std::vector<Scenario> scenarios = {
      {"seed000_permuted_row_map_after_eviction", 2, mutation_index("permuted row map without scratch_indices"),
       [](const GeneratedCall& g) { return g.plan.rows() >= 2; }},
      {"seed000_permuted_row_map_with_scratch_indices_is_legal", 2, -1,
       [](const GeneratedCall& g) {
         const auto& map = g.plan.scratch_row_of_row;
         return g.plan.explicit_scratch_indices && g.plan.row_map && map.size() >= 2 &&
                !std::is_sorted(map.begin(), map.end());
       }},
      {"seed000_more_draft_tokens_than_scratch_steps", 2, mutation_index("T > T_alloc"),
       [](const GeneratedCall&) { return true; }},
      {"seed003_transposed_state_pool", 0, mutation_index("padded or transposed inner dims"),
       [](const GeneratedCall& g) { return arg_of(g, Arg::state).stride[3] != 1; }},
      {"seed003_slot_stride_not_a_multiple_of_16", 0, mutation_index("slot stride not a multiple of 16"),
       [](const GeneratedCall& g) { return arg_of(g, Arg::state).stride[0] % 16 != 0; }},
      {"seed003_16_byte_base_offset", 0, mutation_index("pool base 16 bytes off"),
       [](const GeneratedCall& g) {
         const TensorView& t = arg_of(g, Arg::state);
         return t.address == 0 && t.storage_offset.count * element_size(t.dtype) % 32 == 16;
       }},
      {"seed003_pool_not_4d", 0, mutation_index("a 3-D pool"), [](const GeneratedCall&) { return true; }},
      {"seed004_prefill_without_initial_state", 1, mutation_index("prefill without its pool or indices"),
       [](const GeneratedCall& g) { return !has_arg(g, Arg::initial_state) && has_arg(g, Arg::initial_state_indices); }},
      {"seed004_prefill_without_initial_state_indices", 1, mutation_index("prefill without its pool or indices"),
       [](const GeneratedCall& g) { return has_arg(g, Arg::initial_state) && !has_arg(g, Arg::initial_state_indices); }},
      {"seed004_gate_shorter_than_q", 1, mutation_index("gate or beta shorter than q"),
       [](const GeneratedCall& g) {
         const Arg gate = has_arg(g, Arg::a) ? Arg::a : Arg::g;
         return arg_of(g, gate).shape[0] < arg_of(g, Arg::q).shape[0];
       }},
  };
  for (const Scenario& s : scenarios) {
    ContractsCase c;
    write_file(dir / s.file, contracts_input(s.entry, s.mutation, false, ++seed, &c, s.wanted));
    json_calls.emplace_back(s.file, c.call.call);
  }
}

void write_contracts(const fs::path& dir, std::vector<NamedCall>& json_calls) {
  fs::create_directories(dir);
  std::uint64_t seed = 1;
  int files = 0;
  for (std::size_t e = 0; e < std::size(kEntries); ++e) {
    for (int i = 0; i < 4; ++i) {
      ContractsCase c;
      const std::string name = fmt::format("valid_{}_{}", entry_name(kEntries[e]), i);
      write_file(dir / name, contracts_input(e, -1, false, ++seed, &c));
      json_calls.emplace_back(name, c.call.call);
      ++files;
    }
    for (int i = 0; i < 3; ++i) {
      write_file(dir / fmt::format("edited_{}_{}", entry_name(kEntries[e]), i),
                 contracts_input(e, -1, true, ++seed, nullptr));
      ++files;
    }
  }
  write_seed_scenarios(dir, seed, json_calls);
  files += 10;
  const auto table = mutation_table();
  for (std::size_t m = 0; m < table.size(); ++m) {
    for (std::size_t e = 0; e < std::size(kEntries); ++e) {
      if (!table[m].applies_to(kEntries[e])) continue;
      ContractsCase c;
      const auto bytes = contracts_input(e, static_cast<std::int64_t>(m), false, ++seed, &c);
      const std::string name = fmt::format("{}_{}_{}", rule_id(table[m].rule), entry_name(kEntries[e]),
                                           file_name(table[m].name));
      write_file(dir / name, bytes);
      json_calls.emplace_back(name, c.call.call);
      ++files;
    }
  }
  std::printf("%s: %d inputs\n", dir.string().c_str(), files);
}

void write_check_json(const fs::path& dir, const std::vector<NamedCall>& named) {
  fs::create_directories(dir);
  int files = 0;
  std::vector<AnyCall> calls;
  for (const auto& [name, call] : named) {
    write_file(dir / (name + ".json"), callio::call_to_json(call).dump(1) + "\n");
    calls.push_back(call);
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
      write_file(dir / fmt::format("{}_{}", entry_name(c.plan.entry), seed), record.bytes());
      ++files;
    }
  }
  std::printf("%s: %d inputs\n", dir.string().c_str(), files);
}

// fuzz_gpu: byte 0 the mode, then a recorded case of each entry point, a few problems each.
void write_gpu(const fs::path& dir) {
  fs::create_directories(dir);
  int files = 0;
  for (const GpuMode mode : {GpuMode::conformance, GpuMode::planted}) {
    for (std::int64_t entry = 0; entry < static_cast<std::int64_t>(std::size(kGpuEntries)); ++entry) {
      for (std::uint64_t seed = 1; seed <= 3; ++seed) {
        SeededChooser random(seed * 104729 + static_cast<std::uint64_t>(entry) * 31 +
                             static_cast<std::uint64_t>(mode));
        ScriptedChooser scripted({entry}, random);
        RecordingChooser record(scripted);
        const GpuCase c = draw_gpu_case(mode, record);
        std::vector<std::uint8_t> bytes{static_cast<std::uint8_t>(mode)};
        const std::vector<std::uint8_t> choices = record.bytes();
        bytes.insert(bytes.end(), choices.begin(), choices.end());
        write_file(dir / fmt::format("{}_{}_{}", mode == GpuMode::planted ? "planted" : "conformance",
                                     entry_name(c.entry), seed),
                   bytes);
        ++files;
      }
    }
  }
  std::printf("%s: %d inputs\n", dir.string().c_str(), files);
}

// fuzz_records: a valid call of each record entry point, every record mutation on each entry
// point it applies to (no edits after it), edited calls, and reference problems.
void write_records(const fs::path& dir) {
  fs::create_directories(dir);
  int files = 0;
  std::uint64_t seed = 1;
  // A recorded input whose case has edits (or none) as wanted, checked to replay.
  auto input = [&](std::deque<std::int64_t> script, bool edits) {
    for (;; ++seed) {
      SeededChooser random(seed * 6151);
      ScriptedChooser scripted(script, random);
      RecordingChooser record(scripted);
      const RecordsCase c = draw_records_case(record);
      if (c.mode == RecordsMode::contracts && (c.edits > 0) != edits) continue;
      const auto bytes = record.bytes();
      FuzzedDataProvider data(bytes.data(), bytes.size());
      FuzzChooser replay(data);
      const RecordsCase again = draw_records_case(replay);
      if (c.mode == RecordsMode::contracts &&
          describe_catalogue_call(again.call.call) != describe_catalogue_call(c.call.call)) {
        std::fprintf(stderr, "seed writer: recorded fuzz_records input does not replay\n");
        std::exit(1);
      }
      ++seed;
      return bytes;
    }
  };
  const auto table = record_mutation_table();
  for (std::size_t e = 0; e < std::size(kRecordEntries); ++e) {
    const Entry entry = kRecordEntries[e];
    const auto i = static_cast<std::int64_t>(e);
    write_file(dir / fmt::format("{}_valid", entry_name(entry)), input({0, i, -1}, false));
    write_file(dir / fmt::format("{}_edited", entry_name(entry)), input({0, i, -1}, true));
    files += 2;
    for (std::size_t m = 0; m < table.size(); ++m) {
      if (!table[m].applies_to(entry)) continue;
      write_file(dir / fmt::format("{}_{}_{}", entry_name(entry), m, file_name(table[m].name)),
                 input({0, i, static_cast<std::int64_t>(m)}, false));
      ++files;
    }
  }
  for (int problem = 1; problem <= 8; ++problem) {
    write_file(dir / fmt::format("reference_{}", problem), input({1}, false));
    ++files;
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
  std::vector<NamedCall> calls;
  write_contracts(root / "fuzz_contracts", calls);
  write_check_json(root / "fuzz_check_json", calls);
  write_reference(root / "fuzz_reference");
  write_gpu(root / "fuzz_gpu");
  write_records(root / "fuzz_records");
  return 0;
}
