#include "kdaguard/contracts/tensor_view.h"

#include <charconv>
#include <limits>

namespace kdaguard {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
  }
  return "?";
}

std::optional<DType> dtype_from_name(std::string_view name) {
  for (DType t : {DType::f32, DType::f16, DType::bf16, DType::i32, DType::i64}) {
    if (dtype_name(t) == name) return t;
  }
  return std::nullopt;
}

std::string device_name(Device d) {
  if (d.kind == Device::Kind::cpu) return "cpu";
  return "cuda:" + std::to_string(d.index);
}

std::optional<Device> device_from_name(std::string_view name) {
  if (name == "cpu") return Device{Device::Kind::cpu, 0};
  constexpr std::string_view prefix = "cuda:";
  if (name.substr(0, prefix.size()) != prefix) return std::nullopt;
  std::string_view digits = name.substr(prefix.size());
  int index = 0;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
  if (digits.empty() || ec != std::errc{} || end != digits.data() + digits.size() || index < 0)
    return std::nullopt;
  return Device{Device::Kind::cuda, index};
}

std::optional<Bytes> to_bytes(Elements e, DType t) {
  std::int64_t bytes = 0;
  if (__builtin_mul_overflow(e.count, element_size(t), &bytes)) return std::nullopt;
  return Bytes{bytes};
}

TensorView TensorView::contiguous(DType dtype, std::initializer_list<std::int64_t> shape) {
  return contiguous(dtype, std::vector<std::int64_t>(shape));
}

TensorView TensorView::contiguous(DType dtype, const std::vector<std::int64_t>& shape) {
  TensorView view;
  view.dtype = dtype;
  view.rank = static_cast<int>(shape.size() < kMaxRank ? shape.size() : kMaxRank);
  std::int64_t step = 1;
  for (int d = view.rank - 1; d >= 0; --d) {
    view.shape[d] = shape[d];
    view.stride[d] = step;
    if (shape[d] > 0 && __builtin_mul_overflow(step, shape[d], &step))
      step = std::numeric_limits<std::int64_t>::max();
  }
  return view;
}

std::int64_t TensorView::numel() const {
  if (rank < 0 || rank > kMaxRank) return 0;  // not a view the contracts accept
  std::int64_t n = 1;
  for (int d = 0; d < rank; ++d) {
    if (shape[d] <= 0) return 0;
    if (__builtin_mul_overflow(n, shape[d], &n)) n = std::numeric_limits<std::int64_t>::max();
  }
  return n;
}

std::optional<std::uint64_t> TensorView::data_address() const {
  auto offset = to_bytes(storage_offset, dtype);
  if (!offset || offset->count < 0) return std::nullopt;
  std::uint64_t result = 0;
  if (__builtin_add_overflow(address, static_cast<std::uint64_t>(offset->count), &result))
    return std::nullopt;
  return result;
}

}  // namespace kdaguard
