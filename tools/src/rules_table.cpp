// The rule catalogue as text, JSON and Markdown tables: all three walk rule_catalogue(), so the
// command, the README and the catalogue can't disagree.
#include <algorithm>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "kdaguard/callio.h"

namespace kdaguard::callio {
namespace {

std::vector<std::string> entry_points(const RuleInfo& rule) {
  std::vector<std::string> names;
  for (int e = 0; e < kEntryCount; ++e) {
    const auto entry = static_cast<Entry>(e);
    if (rule.applies_to(entry)) names.emplace_back(entry_name(entry));
  }
  return names;
}

std::string joined(const std::vector<std::string>& items, std::string_view separator) {
  std::string text;
  for (const std::string& item : items) {
    if (!text.empty()) text += separator;
    text += item;
  }
  return text;
}

// A Markdown table cell: a '|' would end the cell early.
std::string cell(std::string_view text) {
  std::string escaped;
  for (const char c : text) {
    if (c == '|') escaped += '\\';
    escaped += c;
  }
  return escaped;
}

}  // namespace

std::string rules_text() {
  struct Row {
    std::string id, tier, entries, meaning;
  };
  std::vector<Row> rows{{"id", "tier", "entry points", "meaning"}};
  for (const RuleInfo& rule : rule_catalogue())
    rows.push_back(Row{std::string(rule.id), std::string(tier_name(rule.tier)),
                       joined(entry_points(rule), ","), std::string(rule.meaning)});
  std::size_t id_width = 0, tier_width = 0, entries_width = 0;
  for (const Row& row : rows) {
    id_width = std::max(id_width, row.id.size());
    tier_width = std::max(tier_width, row.tier.size());
    entries_width = std::max(entries_width, row.entries.size());
  }
  std::string text;
  for (const Row& row : rows)
    text += fmt::format("{:<{}}  {:<{}}  {:<{}}  {}\n", row.id, id_width, row.tier, tier_width,
                        row.entries, entries_width, row.meaning);
  return text;
}

std::string rules_json() {
  // One rule per line: greppable, and still one JSON document.
  std::string text = "{\"rules\": [\n";
  bool first = true;
  for (const RuleInfo& rule : rule_catalogue()) {
    Json j = Json::object();
    j["id"] = std::string(rule.id);
    j["tier"] = std::string(tier_name(rule.tier));
    j["entry_points"] = entry_points(rule);
    j["meaning"] = std::string(rule.meaning);
    if (!first) text += ",\n";
    text += "  " + j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    first = false;
  }
  return text + "\n]}\n";
}

std::string rules_markdown() {
  std::string text = "| id | tier | entry points | meaning |\n|---|---|---|---|\n";
  for (const RuleInfo& rule : rule_catalogue())
    text += fmt::format("| `{}` | {} | {} | {} |\n", rule.id, tier_name(rule.tier),
                        joined(entry_points(rule), ", "), cell(rule.meaning));
  return text;
}

}  // namespace kdaguard::callio
