// A strided view of a tensor, as the contracts see it: dtype, device, shape, strides, where it
// starts inside its allocation, and (for index tensors) an optional host copy of its values.
// Deliberately free of CUDA: the contract layer runs on any CPU.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kdaguard {

enum class DType : std::uint8_t { f32, f16, bf16, i32, i64 };

constexpr std::int64_t element_size(DType t) {
  switch (t) {
    case DType::f16:
    case DType::bf16: return 2;
    case DType::f32:
    case DType::i32: return 4;
    case DType::i64: return 8;
  }
  return 0;
}
std::string_view dtype_name(DType t);
std::optional<DType> dtype_from_name(std::string_view name);

struct Device {
  enum class Kind : std::uint8_t { cpu, cuda };
  Kind kind = Kind::cuda;
  int index = 0;
  friend bool operator==(const Device&, const Device&) = default;
};
std::string device_name(Device d);
// "cpu" or "cuda:N" (N a non-negative decimal integer); anything else is nullopt.
std::optional<Device> device_from_name(std::string_view name);

// Units are kept apart in the types: strides and offsets counted in elements can't be compared
// with byte offsets by accident. A raw int64 crosses between them only through these helpers.
struct Elements {
  std::int64_t count = 0;
  friend bool operator==(const Elements&, const Elements&) = default;
};
struct Bytes {
  std::int64_t count = 0;
  friend bool operator==(const Bytes&, const Bytes&) = default;
};
// Bytes spanned by `e` elements of dtype `t`, or nullopt when that overflows int64.
std::optional<Bytes> to_bytes(Elements e, DType t);

inline constexpr int kMaxRank = 8;

struct TensorView {
  DType dtype = DType::f32;
  std::optional<Device> device;          // absent: the call's device
  int rank = 0;
  std::array<std::int64_t, kMaxRank> shape{};
  std::array<std::int64_t, kMaxRank> stride{};  // in elements
  Elements storage_offset{};             // from the allocation's start to element [0, ..., 0]
  // Byte address of the allocation's start. 0 stands for a 256-byte aligned base of an
  // allocation of its own; views with the same non-zero address share one allocation.
  std::uint64_t address = 0;
  std::optional<Elements> storage_size;  // elements in the allocation, when known
  std::optional<std::vector<std::int64_t>> values;  // host copy of index values, row-major

  // A compact row-major view of the given shape.
  static TensorView contiguous(DType dtype, std::initializer_list<std::int64_t> shape);
  static TensorView contiguous(DType dtype, const std::vector<std::int64_t>& shape);

  std::int64_t numel() const;  // product of the shape (saturates at INT64_MAX; 0 if any size is 0)
  // Address of element [0, ..., 0] when it fits, from address, storage_offset and the dtype.
  std::optional<std::uint64_t> data_address() const;
};

}  // namespace kdaguard
