// parse_call: every field of call-format.md read right, every kind of malformed description
// refused with the place it is wrong.
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include <gtest/gtest.h>

#include "kdaguard/callio.h"

namespace kdaguard::callio {
namespace {

// A minimal decode call, as text, with one tensor's description spliced in.
std::string decode_with_q(const std::string& q) {
  return R"({"entry": "decode", "tensors": {"q": )" + q + "}}";
}

CallResult parse_text(const std::string& text) {
  const Document document = parse_document(text);
  if (document.error) return *document.error;
  EXPECT_EQ(document.calls.size(), 1u) << text;
  return document.calls.at(0).call;
}

// The error of a description that must be malformed.
DescriptionError error_of(const std::string& text) {
  const CallResult result = parse_text(text);
  const auto* error = std::get_if<DescriptionError>(&result);
  if (error == nullptr) {
    ADD_FAILURE() << "accepted as a description: " << text;
    return {};
  }
  return *error;
}

const CatalogueCall& call_of(const CallResult& result) {
  if (const auto* error = std::get_if<DescriptionError>(&result))
    ADD_FAILURE() << "malformed: " << format_error(*error);
  return std::get<CatalogueCall>(result);
}

const TensorView& q_of(const CallResult& result) {
  const OptionalView* q = find_argument(call_of(result), Arg::q);
  EXPECT_TRUE(q != nullptr && q->has_value());
  return **q;
}

TEST(ParseCall, ReadsEveryTensorField) {
  const CallResult result = parse_text(R"({"entry": "verify", "device": "cuda:3", "tensors": {
      "scratch_indices": {"dtype": "i32", "shape": [2, 3], "stride": [4, 1], "storage_offset": 7,
                          "address": 18446744073709551360, "storage_size": 12, "device": "cpu",
                          "values": [0, 1, 2, -1, 5, 6]}}})");
  const CatalogueCall& call = call_of(result);
  EXPECT_EQ(entry_of(call), Entry::verify);
  EXPECT_EQ(device_of(call), (Device{Device::Kind::cuda, 3}));
  const OptionalView* view = find_argument(call, Arg::scratch_indices);
  ASSERT_TRUE(view != nullptr && view->has_value());
  const TensorView& t = **view;
  EXPECT_EQ(t.dtype, DType::i32);
  EXPECT_EQ(t.rank, 2);
  EXPECT_EQ(t.shape[0], 2);
  EXPECT_EQ(t.shape[1], 3);
  EXPECT_EQ(t.stride[0], 4);
  EXPECT_EQ(t.stride[1], 1);
  EXPECT_EQ(t.storage_offset.count, 7);
  EXPECT_EQ(t.address, 18446744073709551360ull);
  ASSERT_TRUE(t.storage_size.has_value());
  EXPECT_EQ(t.storage_size->count, 12);
  EXPECT_EQ(t.device, (Device{Device::Kind::cpu, 0}));
  EXPECT_EQ(t.values, (std::vector<std::int64_t>{0, 1, 2, -1, 5, 6}));
}

TEST(ParseCall, DefaultsFollowTheSpec) {
  const CallResult result = parse_text(decode_with_q(R"({"dtype": "bf16", "shape": [2, 3, 4]})"));
  const CatalogueCall& call = call_of(result);
  EXPECT_EQ(device_of(call), (Device{Device::Kind::cuda, 0}));
  const TensorView& q = q_of(result);
  EXPECT_EQ(q.stride[0], 12);  // contiguous row-major
  EXPECT_EQ(q.stride[1], 4);
  EXPECT_EQ(q.stride[2], 1);
  EXPECT_EQ(q.storage_offset.count, 0);
  EXPECT_EQ(q.address, 0u);
  EXPECT_FALSE(q.storage_size.has_value());
  EXPECT_FALSE(q.device.has_value());
  EXPECT_FALSE(q.values.has_value());
  const Scalars& scalars = scalars_of(call);
  EXPECT_FALSE(scalars.scale.has_value());
  EXPECT_FALSE(scalars.lower_bound.has_value());
  EXPECT_FALSE(scalars.use_qk_l2norm);
  EXPECT_FALSE(scalars.draft_token_num.has_value());
  // Tensors absent from the description are absent from the call.
  EXPECT_FALSE(find_argument(call, Arg::state)->has_value());
}

TEST(ParseCall, ReadsScalarsTheEntryPointTakes) {
  const CatalogueCall call = call_of(parse_text(R"({"entry": "verify", "scalars": {"scale": 0.125,
      "lower_bound": -5, "use_qk_l2norm": true, "draft_token_num": 4}})"));
  const Scalars& s = scalars_of(call);
  EXPECT_EQ(s.scale, 0.125);
  EXPECT_EQ(s.lower_bound, -5.0);
  EXPECT_TRUE(s.use_qk_l2norm);
  EXPECT_EQ(s.draft_token_num, 4);

  const CatalogueCall spelled = call_of(parse_text(
      R"({"entry": "decode", "scalars": {"scale": "inf", "lower_bound": "nan"}})"));
  EXPECT_TRUE(std::isinf(*scalars_of(spelled).scale) && *scalars_of(spelled).scale > 0);
  EXPECT_TRUE(std::isnan(*scalars_of(spelled).lower_bound));
  const CatalogueCall negative = call_of(parse_text(R"({"entry": "prefill", "scalars": {"scale": "-inf"}})"));
  EXPECT_TRUE(std::isinf(*scalars_of(negative).scale) && *scalars_of(negative).scale < 0);
}

// What a TensorView can hold is passed through for the validator to judge.
TEST(ParseCall, PassesThroughWhatTheValidatorJudges) {
  const CallResult negative = parse_text(decode_with_q(
      R"({"dtype": "bf16", "shape": [4, -32, 128], "stride": [-1, 0, 7], "storage_offset": -9,
          "storage_size": -1})"));
  const TensorView& q = q_of(negative);
  EXPECT_EQ(q.shape[1], -32);
  EXPECT_EQ(q.stride[0], -1);
  EXPECT_EQ(q.storage_offset.count, -9);
  EXPECT_EQ(q.storage_size->count, -1);
  EXPECT_TRUE(validate(call_of(negative)).breaks(RuleId::arg_shape));

  // Contiguous strides that don't fit int64 saturate, and the validator reports the extent.
  const CallResult huge = parse_text(decode_with_q(
      R"({"dtype": "bf16", "shape": [4, 4294967296, 4294967296]})"));
  EXPECT_EQ(q_of(huge).stride[0], std::numeric_limits<std::int64_t>::max());
  EXPECT_TRUE(validate(call_of(huge)).breaks(RuleId::arg_extent));

  // Rank 0 and kMaxRank are representable.
  EXPECT_EQ(q_of(parse_text(decode_with_q(R"({"dtype": "f32", "shape": []})"))).rank, 0);
  EXPECT_EQ(q_of(parse_text(decode_with_q(
                R"({"dtype": "f32", "shape": [1, 1, 1, 1, 1, 1, 1, 1]})"))).rank, kMaxRank);
  // With a negative size the element count is unknown, so any number of values is kept.
  const CallResult values = parse_text(R"({"entry": "decode", "tensors": {"cache_indices":
      {"dtype": "i32", "shape": [-2], "values": [1, 2, 3]}}})");
  EXPECT_EQ(find_argument(call_of(values), Arg::cache_indices)->value().values->size(), 3u);
}

struct Malformed {
  const char* name;
  std::string text;
  std::string where;
  std::string message_part;
};

void PrintTo(const Malformed& m, std::ostream* os) { *os << m.name; }

class MalformedDescription : public testing::TestWithParam<Malformed> {};

TEST_P(MalformedDescription, IsRefusedSayingWhere) {
  const Malformed& m = GetParam();
  const DescriptionError error = error_of(m.text);
  EXPECT_EQ(error.where, m.where) << format_error(error);
  EXPECT_NE(error.message.find(m.message_part), std::string::npos) << format_error(error);
}

const std::string kQ = R"("dtype": "bf16", "shape": [4, 32, 128])";

INSTANTIATE_TEST_SUITE_P(
    ParseCall, MalformedDescription,
    testing::Values(
        Malformed{"call_not_object", R"([7])", "/0", "JSON object"},
        Malformed{"unknown_call_field", R"({"entry": "decode", "tensor": {}})", "/tensor",
                  "unknown field 'tensor'"},
        Malformed{"entry_missing", R"({"tensors": {}})", "", "'entry' is missing"},
        Malformed{"entry_not_string", R"({"entry": 1})", "/entry", "expected a string"},
        Malformed{"entry_unknown", R"({"entry": "extend"})", "/entry", "unknown entry point"},
        Malformed{"device_unknown", R"({"entry": "decode", "device": "gpu0"})", "/device",
                  "unknown device"},
        Malformed{"device_index_not_number", R"({"entry": "decode", "device": "cuda:x"})",
                  "/device", "unknown device"},
        Malformed{"tensors_not_object", R"({"entry": "decode", "tensors": []})", "/tensors",
                  "expected an object"},
        Malformed{"tensor_name_unknown", R"({"entry": "decode", "tensors": {"qq": {}}})",
                  "/tensors/qq", "unknown tensor 'qq'"},
        Malformed{"tensor_not_taken", R"({"entry": "decode", "tensors": {"scratch": {}}})",
                  "/tensors/scratch", "decode takes no argument 'scratch'"},
        Malformed{"prefill_takes_no_state", R"({"entry": "prefill", "tensors": {"state": {}}})",
                  "/tensors/state", "prefill takes no argument 'state'"},
        Malformed{"commit_takes_no_q", R"({"entry": "commit", "tensors": {"q": {}}})",
                  "/tensors/q", "commit takes no argument 'q'"},
        Malformed{"tensor_not_object", decode_with_q("[4, 32, 128]"), "/tensors/q",
                  "expected a tensor object"},
        Malformed{"tensor_field_unknown", decode_with_q("{" + kQ + R"(, "strides": [1, 1, 1]})"),
                  "/tensors/q/strides", "unknown field 'strides'"},
        Malformed{"dtype_missing", decode_with_q(R"({"shape": [1]})"), "/tensors/q",
                  "'dtype' is missing"},
        Malformed{"dtype_unknown", decode_with_q(R"({"dtype": "fp8", "shape": [1]})"),
                  "/tensors/q/dtype", "unknown dtype 'fp8'"},
        Malformed{"shape_missing", decode_with_q(R"({"dtype": "f32"})"), "/tensors/q",
                  "'shape' is missing"},
        Malformed{"shape_not_array", decode_with_q(R"({"dtype": "f32", "shape": 4})"),
                  "/tensors/q/shape", "expected an array"},
        Malformed{"rank_too_high",
                  decode_with_q(R"({"dtype": "f32", "shape": [1, 1, 1, 1, 1, 1, 1, 1, 1]})"),
                  "/tensors/q/shape", "rank 9 exceeds"},
        Malformed{"size_fraction", decode_with_q(R"({"dtype": "f32", "shape": [4, 2.5]})"),
                  "/tensors/q/shape/1", "got the number 2.5"},
        Malformed{"size_written_as_float", decode_with_q(R"({"dtype": "f32", "shape": [4.0]})"),
                  "/tensors/q/shape/0", "expected a signed 64-bit integer"},
        Malformed{"size_string", decode_with_q(R"({"dtype": "f32", "shape": [4, "32"]})"),
                  "/tensors/q/shape/1", "got a string"},
        Malformed{"size_null", decode_with_q(R"({"dtype": "f32", "shape": [null]})"),
                  "/tensors/q/shape/0", "got null"},
        Malformed{"size_past_int64",
                  decode_with_q(R"({"dtype": "f32", "shape": [9223372036854775808]})"),
                  "/tensors/q/shape/0", "does not fit a signed 64-bit integer"},
        Malformed{"size_past_uint64",
                  decode_with_q(R"({"dtype": "f32", "shape": [123456789012345678901234567890]})"),
                  "/tensors/q/shape/0", "outside the 64-bit integer range"},
        Malformed{"stride_rank_differs",
                  decode_with_q("{" + kQ + R"(, "stride": [128, 1]})"), "/tensors/q/stride",
                  "2 strides for a shape of rank 3"},
        Malformed{"stride_past_int64",
                  decode_with_q("{" + kQ + R"(, "stride": [1, 1, -9223372036854775809]})"),
                  "/tensors/q/stride/2", "outside the 64-bit integer range"},
        Malformed{"offset_string", decode_with_q("{" + kQ + R"(, "storage_offset": "0"})"),
                  "/tensors/q/storage_offset", "got a string"},
        Malformed{"address_negative", decode_with_q("{" + kQ + R"(, "address": -256})"),
                  "/tensors/q/address", "negative"},
        Malformed{"address_past_uint64",
                  decode_with_q("{" + kQ + R"(, "address": 18446744073709551616})"),
                  "/tensors/q/address", "outside the 64-bit integer range"},
        Malformed{"storage_size_bool", decode_with_q("{" + kQ + R"(, "storage_size": true})"),
                  "/tensors/q/storage_size", "got a boolean"},
        Malformed{"tensor_device_unknown", decode_with_q("{" + kQ + R"(, "device": "cuda:-1"})"),
                  "/tensors/q/device", "unknown device"},
        Malformed{"values_on_float_tensor", decode_with_q("{" + kQ + R"(, "values": []})"),
                  "/tensors/q/values", "index tensors"},
        Malformed{"values_not_array",
                  R"({"entry": "decode", "tensors": {"cache_indices": {"dtype": "i32",
                     "shape": [2], "values": 3}}})",
                  "/tensors/cache_indices/values", "expected an array"},
        Malformed{"values_count_differs",
                  R"({"entry": "decode", "tensors": {"cache_indices": {"dtype": "i32",
                     "shape": [2, 2], "values": [0, 1, 2]}}})",
                  "/tensors/cache_indices/values", "3 values for a shape of 4 elements"},
        Malformed{"values_outside_i32",
                  R"({"entry": "decode", "tensors": {"cache_indices": {"dtype": "i32",
                     "shape": [2], "values": [0, 2147483648]}}})",
                  "/tensors/cache_indices/values/1", "does not fit the tensor's dtype i32"},
        Malformed{"values_fraction",
                  R"({"entry": "decode", "tensors": {"cache_indices": {"dtype": "i64",
                     "shape": [2], "values": [0, 0.5]}}})",
                  "/tensors/cache_indices/values/1", "got the number 0.5"},
        Malformed{"scalars_not_object", R"({"entry": "decode", "scalars": [1]})", "/scalars",
                  "expected an object"},
        Malformed{"scalar_unknown", R"({"entry": "decode", "scalars": {"softcap": 1}})",
                  "/scalars/softcap", "unknown scalar"},
        Malformed{"scalar_not_taken", R"({"entry": "decode", "scalars": {"draft_token_num": 2}})",
                  "/scalars/draft_token_num", "decode takes no scalar 'draft_token_num'"},
        Malformed{"commit_takes_no_scale", R"({"entry": "commit", "scalars": {"scale": 1}})",
                  "/scalars/scale", "commit takes no scalar 'scale'"},
        Malformed{"scale_string", R"({"entry": "decode", "scalars": {"scale": "infinity"}})",
                  "/scalars/scale", "got the string 'infinity'"},
        Malformed{"scale_null", R"({"entry": "decode", "scalars": {"scale": null}})",
                  "/scalars/scale", "expected a number"},
        Malformed{"l2norm_not_bool", R"({"entry": "decode", "scalars": {"use_qk_l2norm": 1}})",
                  "/scalars/use_qk_l2norm", "expected true or false"},
        Malformed{"draft_tokens_fraction",
                  R"({"entry": "verify", "scalars": {"draft_token_num": 2.0}})",
                  "/scalars/draft_token_num", "expected a signed 64-bit integer"},
        Malformed{"duplicate_key", decode_with_q(R"({"dtype": "f32", "dtype": "bf16", "shape": []})"),
                  "/tensors/q/dtype", "appears twice"},
        Malformed{"duplicate_tensor",
                  R"({"entry": "decode", "tensors": {"q": {}, "k": {}, "q": {}}})", "/tensors/q",
                  "appears twice"},
        Malformed{"odd_key_is_shown_escaped",
                  R"({"entry": "decode", "tensors": {"q/\n~": {}}})", "/tensors/q~1\\x0a~0",
                  "unknown tensor 'q/\\x0a~'"}),
    [](const testing::TestParamInfo<Malformed>& info) { return std::string(info.param.name); });

// Calls a C++ caller can't get wrong but JSON can: a plain nlohmann::json is read the same way.
TEST(ParseCall, ReadsPlainJsonToo) {
  const nlohmann::json plain = nlohmann::json::parse(R"({"entry": "commit",
      "tensors": {"accepted": {"dtype": "i32", "shape": [2], "values": [1, 0]}},
      "scalars": {"draft_token_num": 3}})");
  const CallResult result = parse_call(plain);
  const CatalogueCall& call = call_of(result);
  EXPECT_EQ(entry_of(call), Entry::commit);
  EXPECT_EQ(scalars_of(call).draft_token_num, 3);
  const nlohmann::json bad = nlohmann::json::parse(R"({"entry": "commit", "x": 1})");
  ASSERT_TRUE(std::holds_alternative<DescriptionError>(parse_call(bad)));
  EXPECT_EQ(std::get<DescriptionError>(parse_call(bad)).where, "/x");
}

}  // namespace
}  // namespace kdaguard::callio
