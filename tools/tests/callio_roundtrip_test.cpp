// call_to_json is the inverse of parse_call: fresh random calls survive JSON text unchanged.
#include <cmath>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "kdaguard/callio.h"
#include "random_calls.h"

namespace kdaguard::callio {
namespace {

using testing_support::Random;

bool same_real(double a, double b) { return (std::isnan(a) && std::isnan(b)) || a == b; }
bool same_real(const std::optional<double>& a, const std::optional<double>& b) {
  return a.has_value() == b.has_value() && (!a || same_real(*a, *b));
}

// Field-by-field differences of two views (only the first `rank` sizes and strides mean anything).
std::string view_differences(const TensorView& a, const TensorView& b) {
  std::string diff;
  if (a.dtype != b.dtype) diff += " dtype";
  if (a.device != b.device) diff += " device";
  if (a.rank != b.rank) return diff + " rank";
  for (int d = 0; d < a.rank; ++d) {
    if (a.shape[d] != b.shape[d]) diff += fmt::format(" shape[{}]", d);
    if (a.stride[d] != b.stride[d]) diff += fmt::format(" stride[{}]", d);
  }
  if (a.storage_offset != b.storage_offset) diff += " storage_offset";
  if (a.address != b.address) diff += " address";
  if (a.storage_size != b.storage_size) diff += " storage_size";
  if (a.values != b.values) diff += " values";
  return diff;
}

std::string call_differences(const CatalogueCall& a, const CatalogueCall& b) {
  if (entry_of(a) != entry_of(b)) return "entry";
  std::string diff;
  if (device_of(a) != device_of(b)) diff += " device";
  const Scalars& sa = scalars_of(a);
  const Scalars& sb = scalars_of(b);
  if (!same_real(sa.scale, sb.scale)) diff += " scale";
  if (!same_real(sa.lower_bound, sb.lower_bound)) diff += " lower_bound";
  if (sa.use_qk_l2norm != sb.use_qk_l2norm) diff += " use_qk_l2norm";
  if (sa.draft_token_num != sb.draft_token_num) diff += " draft_token_num";
  for (int i = 0; i < kArgCount; ++i) {
    const auto arg = static_cast<Arg>(i);
    const OptionalView* va = find_argument(a, arg);
    const OptionalView* vb = find_argument(b, arg);
    if ((va == nullptr) != (vb == nullptr)) return diff + " argument slots";
    if (va == nullptr) continue;
    if (va->has_value() != vb->has_value()) {
      diff += fmt::format(" {} presence", arg_name(arg));
    } else if (va->has_value()) {
      const std::string d = view_differences(**va, **vb);
      if (!d.empty()) diff += fmt::format(" {}:{}", arg_name(arg), d);
    }
  }
  return diff;
}

CatalogueCall reparsed(const std::string& text) {
  const Document document = parse_document(text);
  if (document.error) {
    ADD_FAILURE() << format_error(*document.error) << "\n" << text;
    return make_catalogue_call(Entry::decode);
  }
  EXPECT_EQ(document.calls.size(), 1u);
  if (const auto* error = std::get_if<DescriptionError>(&document.calls.at(0).call)) {
    ADD_FAILURE() << format_error(*error) << "\n" << text;
    return make_catalogue_call(Entry::decode);
  }
  return std::get<CatalogueCall>(document.calls.at(0).call);
}

TEST(RoundTrip, RandomCallsSurviveJsonText) {
  const std::uint64_t seed = testing_support::test_seed();
  SCOPED_TRACE(fmt::format("KDAGUARD_TEST_SEED={}", seed));
  Random random(seed);
  for (int i = 0; i < 2000; ++i) {
    const CatalogueCall call = random_call(random);
    const Json json = call_to_json(call);
    const std::string compact = json.dump();
    const CatalogueCall back = reparsed(compact);
    ASSERT_EQ(call_differences(call, back), "") << compact;
    // Pretty-printed text reads the same, and the second trip gives the same text.
    ASSERT_EQ(call_differences(call, reparsed(json.dump(2))), "");
    ASSERT_EQ(call_to_json(back).dump(), compact);
  }
}

TEST(RoundTrip, WritesOnlyWhatTheEntryPointTakes) {
  CatalogueCall commit = make_catalogue_call(Entry::commit);
  scalars_of(commit).draft_token_num = 3;
  const Json json = call_to_json(commit);
  ASSERT_TRUE(json.contains("scalars"));
  EXPECT_EQ(json["scalars"].dump(), R"({"draft_token_num":3})");
  EXPECT_EQ(json["tensors"].dump(), "{}");

  CatalogueCall decode = make_catalogue_call(Entry::decode);
  scalars_of(decode).scale = std::numeric_limits<double>::infinity();
  EXPECT_EQ(call_to_json(decode)["scalars"].dump(), R"({"scale":"inf","use_qk_l2norm":false})");
}

// The spec's own example (call-format.md) reads, and writes back as the same call.
TEST(RoundTrip, SpecExample) {
  const std::string example = R"({
  "entry": "decode",
  "device": "cuda:0",
  "tensors": {
    "q":     {"dtype": "bf16", "shape": [4, 32, 128], "stride": [12288, 128, 1]},
    "k":     {"dtype": "bf16", "shape": [4, 32, 128], "stride": [12288, 128, 1], "storage_offset": 4096},
    "v":     {"dtype": "bf16", "shape": [4, 32, 128], "stride": [12288, 128, 1], "storage_offset": 8192},
    "a":     {"dtype": "bf16", "shape": [4, 32, 128]},
    "A_log": {"dtype": "f32", "shape": [32]},
    "dt_bias": {"dtype": "f32", "shape": [4096]},
    "b":     {"dtype": "bf16", "shape": [4, 32]},
    "state": {"dtype": "f32", "shape": [16, 32, 128, 128], "stride": [524288, 16384, 128, 1]},
    "cache_indices": {"dtype": "i32", "shape": [4], "values": [3, 7, -1, 0]},
    "out":   {"dtype": "bf16", "shape": [4, 32, 128]}
  },
  "scalars": {"scale": 0.08838834764831845, "lower_bound": -5.0, "use_qk_l2norm": true}
})";
  const CatalogueCall call = reparsed(example);
  const OptionalView* k = find_argument(call, Arg::k);
  ASSERT_TRUE(k && k->has_value());
  EXPECT_EQ((*k)->storage_offset.count, 4096);
  EXPECT_EQ(scalars_of(call).scale, 0.08838834764831845);
  EXPECT_EQ(call_differences(call, reparsed(call_to_json(call).dump())), "");
}

}  // namespace
}  // namespace kdaguard::callio
