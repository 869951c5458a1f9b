// One call description (JSON object) <-> one call of any entry point of the catalogue.
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "kdaguard/callio.h"
#include "text_util.h"

namespace kdaguard::callio {
namespace {

constexpr std::string_view kCallFields = "entry, device, tensors, scalars";
constexpr std::string_view kTensorFields =
    "dtype, shape, stride, storage_offset, address, storage_size, device, values";

// Which scalars an entry point takes, derived from the catalogue and the argument lists so that
// the format can't drift from the contracts: scale, lower_bound and use_qk_l2norm go with q;
// draft_token_num goes wherever verify.draft_tokens applies.
bool takes_scalar(Entry entry, std::string_view name) {
  if (name == "scale" || name == "lower_bound" || name == "use_qk_l2norm")
    return entry_takes(entry, Arg::q);
  if (name == "draft_token_num") return rule_info(RuleId::verify_draft_tokens).applies_to(entry);
  return false;
}
constexpr std::string_view kScalarNames[] = {"scale", "lower_bound", "use_qk_l2norm",
                                              "draft_token_num"};

std::string scalar_list(Entry entry) {
  std::string list;
  for (std::string_view name : kScalarNames) {
    if (!takes_scalar(entry, name)) continue;
    if (!list.empty()) list += ", ";
    list += name;
  }
  return list.empty() ? std::string("none") : list;
}

// Every entry point, in catalogue order: "decode, prefill, ..., accept_verify".
std::string entry_list() {
  std::string text;
  for (int e = 0; e < kEntryCount; ++e)
    text += fmt::format("{}{}", e == 0 ? "" : ", ", entry_name(static_cast<Entry>(e)));
  return text;
}

std::string argument_list(Entry entry) {
  std::string list;
  for (int i = 0; i < kArgCount; ++i) {
    const auto arg = static_cast<Arg>(i);
    if (!entry_takes(entry, arg)) continue;
    if (!list.empty()) list += ", ";
    list += arg_name(arg);
  }
  return list;
}

// Product of the sizes when every size is non-negative and the product fits int64.
std::optional<std::int64_t> checked_numel(const TensorView& view) {
  std::int64_t n = 1;
  for (int d = 0; d < view.rank; ++d) {
    if (view.shape[d] < 0) return std::nullopt;
    if (__builtin_mul_overflow(n, view.shape[d], &n)) return std::nullopt;
  }
  return n;
}

// The default strides: TensorView::contiguous's, the one definition of a compact view. A stride
// that doesn't fit int64 saturates there, and the validator reports the overflowing extent
// (arg.extent) rather than the reader refusing a description a TensorView can hold.
void set_contiguous_strides(TensorView& view) {
  const std::vector<std::int64_t> shape(view.shape.begin(), view.shape.begin() + view.rank);
  view.stride = TensorView::contiguous(view.dtype, shape).stride;
}

template <class J>
class CallReader {
 public:
  std::optional<DescriptionError> error;

  std::optional<CatalogueCall> read_call(const J& j) {
    if (!j.is_object())
      return fail_none("", fmt::format("a call description is a JSON object, got {}", kind(j)));
    for (const auto& [key, value] : j.items()) {
      if (key != "entry" && key != "device" && key != "tensors" && key != "scalars")
        return fail_none(member("", key),
                         fmt::format("unknown field '{}' (a call has {})", shown(key), kCallFields));
    }
    const auto entry_it = j.find("entry");
    if (entry_it == j.end())
      return fail_none("", fmt::format("the field 'entry' is missing ({})", entry_list()));
    const auto* entry_text = entry_it->template get_ptr<const typename J::string_t*>();
    if (entry_text == nullptr)
      return fail_none("/entry", fmt::format("expected a string, got {}", kind(*entry_it)));
    const std::optional<Entry> entry = entry_from_name(*entry_text);
    if (!entry)
      return fail_none("/entry", fmt::format("unknown entry point '{}' ({})", shown(*entry_text),
                                             entry_list()));
    CatalogueCall call = make_catalogue_call(*entry);

    if (const auto it = j.find("device"); it != j.end()) {
      std::optional<Device> device;
      if (!read_device(*it, "/device", device)) return std::nullopt;
      std::visit([&](auto& c) { c.device = *device; }, call);
    }
    if (const auto it = j.find("tensors"); it != j.end()) {
      if (!read_tensors(*it, *entry, call)) return std::nullopt;
    }
    if (const auto it = j.find("scalars"); it != j.end()) {
      if (!read_scalars(*it, *entry, scalars_of(call))) return std::nullopt;
    }
    return call;
  }

 private:
  bool fail(std::string where, std::string message) {
    error = DescriptionError{std::move(where), std::move(message)};
    return false;
  }
  std::nullopt_t fail_none(std::string where, std::string message) {
    fail(std::move(where), std::move(message));
    return std::nullopt;
  }

  static std::string kind(const J& j) { return json_kind(j); }

  static std::string member(const std::string& where, std::string_view key) {
    return where + "/" + pointer_segment(key);
  }

  bool read_int64(const J& j, const std::string& where, std::int64_t& out) {
    if (const auto* u = j.template get_ptr<const typename J::number_unsigned_t*>()) {
      if (*u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
        return fail(where, fmt::format("{} does not fit a signed 64-bit integer", *u));
      out = static_cast<std::int64_t>(*u);
      return true;
    }
    if (const auto* i = j.template get_ptr<const typename J::number_integer_t*>()) {
      out = *i;
      return true;
    }
    return fail_not_integer(j, where, "a signed 64-bit integer");
  }

  bool read_uint64(const J& j, const std::string& where, std::uint64_t& out) {
    if (const auto* u = j.template get_ptr<const typename J::number_unsigned_t*>()) {
      out = *u;
      return true;
    }
    if (const auto* i = j.template get_ptr<const typename J::number_integer_t*>())
      return fail(where, fmt::format("{} is negative; expected an unsigned 64-bit byte address", *i));
    return fail_not_integer(j, where, "an unsigned 64-bit byte address");
  }

  bool fail_not_integer(const J& j, const std::string& where, std::string_view expected) {
    if (const auto* d = j.template get_ptr<const typename J::number_float_t*>()) {
      // JSON integers too long for 64 bits arrive as floating-point numbers.
      if (std::trunc(*d) == *d && std::fabs(*d) >= 0x1p63)
        return fail(where, fmt::format("{} is outside the 64-bit integer range; expected {}", *d,
                                       expected));
      return fail(where, fmt::format("expected {}, got the number {}", expected, *d));
    }
    return fail(where, fmt::format("expected {}, got {}", expected, kind(j)));
  }

  bool read_device(const J& j, const std::string& where, std::optional<Device>& out) {
    const auto* text = j.template get_ptr<const typename J::string_t*>();
    if (text == nullptr)
      return fail(where, fmt::format("expected a device name (\"cpu\" or \"cuda:N\"), got {}",
                                     kind(j)));
    out = device_from_name(*text);
    if (!out)
      return fail(where, fmt::format("unknown device '{}' (\"cpu\" or \"cuda:N\")", shown(*text)));
    return true;
  }

  bool read_tensors(const J& j, Entry entry, CatalogueCall& call) {
    if (!j.is_object())
      return fail("/tensors", fmt::format("expected an object of tensors by argument name, got {}",
                                          kind(j)));
    for (const auto& [name, description] : j.items()) {
      const std::string where = member("/tensors", name);
      const std::optional<Arg> arg = arg_from_name(name);
      if (!arg)
        return fail(where, fmt::format("unknown tensor '{}' (arguments of {}: {})", shown(name),
                                       entry_name(entry), argument_list(entry)));
      OptionalView* slot = find_argument(call, *arg);
      if (slot == nullptr || !entry_takes(entry, *arg))
        return fail(where, fmt::format("{} takes no argument '{}' (it takes {})", entry_name(entry),
                                       name, argument_list(entry)));
      TensorView view;
      if (!read_tensor(description, where, view)) return false;
      *slot = std::move(view);
    }
    return true;
  }

  bool read_tensor(const J& j, const std::string& where, TensorView& view) {
    if (!j.is_object())
      return fail(where, fmt::format("expected a tensor object, got {}", kind(j)));
    for (const auto& [key, value] : j.items()) {
      if (key != "dtype" && key != "shape" && key != "stride" && key != "storage_offset" &&
          key != "address" && key != "storage_size" && key != "device" && key != "values")
        return fail(member(where, key),
                    fmt::format("unknown field '{}' (a tensor has {})", shown(key), kTensorFields));
    }

    const auto dtype_it = j.find("dtype");
    if (dtype_it == j.end())
      return fail(where, "the field 'dtype' is missing (f32, f16, bf16, i32 or i64)");
    const auto* dtype_text = dtype_it->template get_ptr<const typename J::string_t*>();
    if (dtype_text == nullptr)
      return fail(where + "/dtype", fmt::format("expected a string, got {}", kind(*dtype_it)));
    const std::optional<DType> dtype = dtype_from_name(*dtype_text);
    if (!dtype)
      return fail(where + "/dtype",
                  fmt::format("unknown dtype '{}' (f32, f16, bf16, i32, i64)", shown(*dtype_text)));
    view.dtype = *dtype;

    const auto shape_it = j.find("shape");
    if (shape_it == j.end())
      return fail(where, "the field 'shape' is missing (sizes, outermost first)");
    if (!read_sizes(*shape_it, where + "/shape", view.shape, view.rank)) return false;

    if (const auto it = j.find("stride"); it != j.end()) {
      int stride_rank = 0;
      if (!read_sizes(*it, where + "/stride", view.stride, stride_rank)) return false;
      if (stride_rank != view.rank)
        return fail(where + "/stride", fmt::format("{} strides for a shape of rank {}; give one "
                                                   "stride per dimension", stride_rank, view.rank));
    } else {
      set_contiguous_strides(view);
    }

    if (const auto it = j.find("storage_offset"); it != j.end()) {
      if (!read_int64(*it, where + "/storage_offset", view.storage_offset.count)) return false;
    }
    if (const auto it = j.find("address"); it != j.end()) {
      if (!read_uint64(*it, where + "/address", view.address)) return false;
    }
    if (const auto it = j.find("storage_size"); it != j.end()) {
      Elements size;
      if (!read_int64(*it, where + "/storage_size", size.count)) return false;
      view.storage_size = size;
    }
    if (const auto it = j.find("device"); it != j.end()) {
      if (!read_device(*it, where + "/device", view.device)) return false;
    }
    if (const auto it = j.find("values"); it != j.end()) {
      if (!read_values(*it, where + "/values", view)) return false;
    }
    return true;
  }

  // A shape or a stride: an array of at most kMaxRank signed 64-bit integers.
  bool read_sizes(const J& j, const std::string& where,
                  std::array<std::int64_t, kMaxRank>& out, int& rank) {
    if (!j.is_array())
      return fail(where, fmt::format("expected an array of integers, got {}", kind(j)));
    if (j.size() > static_cast<std::size_t>(kMaxRank))
      return fail(where, fmt::format("rank {} exceeds the supported maximum {}", j.size(), kMaxRank));
    rank = static_cast<int>(j.size());
    for (int d = 0; d < rank; ++d) {
      if (!read_int64(j[static_cast<std::size_t>(d)], fmt::format("{}/{}", where, d), out[d]))
        return false;
    }
    return true;
  }

  bool read_values(const J& j, const std::string& where, TensorView& view) {
    if (view.dtype != DType::i32 && view.dtype != DType::i64)
      return fail(where, fmt::format("values are host copies of index tensors (i32, i64); this "
                                     "tensor is {}", dtype_name(view.dtype)));
    if (!j.is_array())
      return fail(where, fmt::format("expected an array of integers, got {}", kind(j)));
    if (const std::optional<std::int64_t> numel = checked_numel(view);
        numel && static_cast<std::uint64_t>(*numel) != j.size())
      return fail(where, fmt::format("{} values for a shape of {} elements", j.size(), *numel));
    std::vector<std::int64_t> values(j.size());
    for (std::size_t i = 0; i < j.size(); ++i) {
      const std::string item = fmt::format("{}/{}", where, i);
      if (!read_int64(j[i], item, values[i])) return false;
      if (view.dtype == DType::i32 && (values[i] < std::numeric_limits<std::int32_t>::min() ||
                                       values[i] > std::numeric_limits<std::int32_t>::max()))
        return fail(item, fmt::format("{} does not fit the tensor's dtype i32", values[i]));
    }
    view.values = std::move(values);
    return true;
  }

  bool read_scalars(const J& j, Entry entry, Scalars& scalars) {
    if (!j.is_object())
      return fail("/scalars", fmt::format("expected an object, got {}", kind(j)));
    for (const auto& [key, value] : j.items()) {
      const std::string where = member("/scalars", key);
      bool known = false;
      for (std::string_view name : kScalarNames) known = known || key == name;
      if (!known)
        return fail(where, fmt::format("unknown scalar '{}' (scale, lower_bound, use_qk_l2norm, "
                                       "draft_token_num)", shown(key)));
      if (!takes_scalar(entry, key))
        return fail(where, fmt::format("{} takes no scalar '{}' (it takes {})", entry_name(entry),
                                       key, scalar_list(entry)));
      if (key == "scale") {
        if (!read_real(value, where, scalars.scale)) return false;
      } else if (key == "lower_bound") {
        if (!read_real(value, where, scalars.lower_bound)) return false;
      } else if (key == "use_qk_l2norm") {
        const auto* flag = value.template get_ptr<const typename J::boolean_t*>();
        if (flag == nullptr)
          return fail(where, fmt::format("expected true or false, got {}", kind(value)));
        scalars.use_qk_l2norm = *flag;
      } else {
        std::int64_t tokens = 0;
        if (!read_int64(value, where, tokens)) return false;
        scalars.draft_token_num = tokens;
      }
    }
    return true;
  }

  // A number, or one of the strings "inf", "-inf", "nan" for the values JSON numbers can't spell.
  bool read_real(const J& j, const std::string& where, std::optional<double>& out) {
    if (j.is_number()) {
      out = j.template get<double>();
      return true;
    }
    if (const auto* text = j.template get_ptr<const typename J::string_t*>()) {
      if (*text == "inf") { out = std::numeric_limits<double>::infinity(); return true; }
      if (*text == "-inf") { out = -std::numeric_limits<double>::infinity(); return true; }
      if (*text == "nan") { out = std::numeric_limits<double>::quiet_NaN(); return true; }
      return fail(where, fmt::format("expected a number (or \"inf\", \"-inf\", \"nan\"), got the "
                                     "string '{}'", shown(*text)));
    }
    return fail(where, fmt::format("expected a number, got {}", kind(j)));
  }
};

template <class J>
CallResult parse_any(const J& description) {
  CallReader<J> reader;
  std::optional<CatalogueCall> call = reader.read_call(description);
  if (call) return std::move(*call);
  return *reader.error;
}

Json real_to_json(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  return x;
}

Json tensor_to_json(const TensorView& view) {
  Json j = Json::object();
  j["dtype"] = std::string(dtype_name(view.dtype));
  Json shape = Json::array();
  Json stride = Json::array();
  for (int d = 0; d < view.rank; ++d) {
    shape.push_back(view.shape[d]);
    stride.push_back(view.stride[d]);
  }
  j["shape"] = std::move(shape);
  j["stride"] = std::move(stride);
  if (view.storage_offset.count != 0) j["storage_offset"] = view.storage_offset.count;
  if (view.address != 0) j["address"] = view.address;
  if (view.storage_size) j["storage_size"] = view.storage_size->count;
  if (view.device) j["device"] = device_name(*view.device);
  if (view.values) j["values"] = *view.values;
  return j;
}

}  // namespace

std::string format_error(const DescriptionError& error) {
  if (error.where.empty()) return error.message;
  return error.where + ": " + error.message;
}

CallResult parse_call(const Json& description) { return parse_any(description); }
CallResult parse_call(const nlohmann::json& description) { return parse_any(description); }

Json call_to_json(const AnyCall& call) { return call_to_json(widen(call)); }

Json call_to_json(const CatalogueCall& call) {
  const Entry entry = entry_of(call);
  Json j = Json::object();
  j["entry"] = std::string(entry_name(entry));
  j["device"] = device_name(device_of(call));
  Json tensors = Json::object();
  for_each_argument(call, [&](Arg arg, const OptionalView& view) {
    if (view) tensors[std::string(arg_name(arg))] = tensor_to_json(*view);
  });
  j["tensors"] = std::move(tensors);
  const Scalars& scalars = scalars_of(call);
  Json js = Json::object();
  if (scalars.scale && takes_scalar(entry, "scale")) js["scale"] = real_to_json(*scalars.scale);
  if (scalars.lower_bound && takes_scalar(entry, "lower_bound"))
    js["lower_bound"] = real_to_json(*scalars.lower_bound);
  if (takes_scalar(entry, "use_qk_l2norm")) js["use_qk_l2norm"] = scalars.use_qk_l2norm;
  if (scalars.draft_token_num && takes_scalar(entry, "draft_token_num"))
    js["draft_token_num"] = *scalars.draft_token_num;
  if (!js.empty()) j["scalars"] = std::move(js);
  return j;
}

}  // namespace kdaguard::callio
