#include "view_edits.h"

#include <fmt/ranges.h>

namespace kdaguard::support::view_edits {

using i64 = std::int64_t;

std::string shape_text(const TensorView& t) {
  return fmt::format("({})", fmt::join(std::span(t.shape.data(), static_cast<std::size_t>(t.rank)), ", "));
}
std::string stride_text(const TensorView& t) {
  return fmt::format("({})", fmt::join(std::span(t.stride.data(), static_cast<std::size_t>(t.rank)), ", "));
}

std::uint64_t data_address(const TensorView& t) {
  return t.address + static_cast<std::uint64_t>(t.storage_offset.count * element_size(t.dtype));
}
std::string byte_range_text(const TensorView& t) {
  i64 last = 0;
  for (int d = 0; d < t.rank; ++d) last += (t.shape[d] - 1) * t.stride[d];
  const std::uint64_t begin = data_address(t);
  return fmt::format("[{:#x}, {:#x})", begin,
                     begin + static_cast<std::uint64_t>((last + 1) * element_size(t.dtype)));
}

void detach_compact(TensorView& t) {
  t.address = 0;
  t.storage_offset = Elements{0};
  t.storage_size.reset();
  i64 step = 1;
  for (int d = std::min(t.rank, kMaxRank) - 1; d >= 0; --d) {
    t.stride[d] = step;
    if (__builtin_mul_overflow(step, std::max<i64>(t.shape[d], 1), &step))
      step = std::numeric_limits<i64>::max();  // absurd shapes (fuzzing): saturate
  }
}

Device other_device(Device d) {
  if (d.kind == Device::Kind::cpu) return Device{Device::Kind::cuda, 0};
  return Device{Device::Kind::cuda, d.index + 1};
}

namespace {

// Rewrites the slot (scratch: step) and HV strides of a pool in an allocation of its own.
void restride_pool(Pool pool, i64 slot, i64 head) {
  TensorView& t = pool.view;
  t.address = 0;
  t.storage_size.reset();
  t.stride[pool.inner] = head;
  t.stride[pool.inner - 1] = slot;
  if (pool.inner == 2) t.stride[0] = slot * t.shape[1];
}
i64 heads(Pool pool) { return pool.view.shape[pool.inner]; }
i64 head_elements(Pool pool) { return pool.view.shape[pool.inner + 1] * pool.view.shape[pool.inner + 2]; }

}  // namespace

void pad_pool_heads(Pool pool, Chooser& c, std::vector<std::string>& texts) {
  TensorView& t = pool.view;
  const int inner = pool.inner;
  const i64 HV = heads(pool), VK = head_elements(pool);
  if (c.coin()) {
    restride_pool(pool, HV * (VK + 16) + 16 * c.pick(0, 2), VK + 16);
  } else {
    // A transposed view of a [.., K, V] pool: the seed's "vendor layout".
    t.stride[inner + 1] = 1;
    t.stride[inner + 2] = t.shape[inner + 1];
  }
  texts.push_back(fmt::format("compact (V*K, K, 1)=({}, {}, 1); got ({}, {}, {})", VK,
                              t.shape[inner + 2], t.stride[inner], t.stride[inner + 1],
                              t.stride[inner + 2]));
  texts.push_back(fmt::format("for {}", pool.name));
}

void misalign_slot_stride(Pool pool, Chooser& c, std::vector<std::string>& texts) {
  const i64 HV = heads(pool), VK = head_elements(pool);
  restride_pool(pool, HV * VK + 16 * c.pick(0, 2) + c.pick(1, 15), VK);
  // Seed 003's text, then the pool's own numbers.
  texts.push_back(fmt::format("recurrent_kda state pool breaks the compiled stride contract: {} slot "
                              "stride {} elements must be a multiple of 16",
                              pool.name, pool.view.stride[pool.inner - 1]));
}

void misalign_pool_base(Pool pool, Chooser& c, std::vector<std::string>& texts) {
  TensorView& t = pool.view;
  const i64 es = element_size(t.dtype);
  t.storage_size.reset();
  if (c.coin()) {
    t.address = 0;
    t.storage_offset = Elements{(32 * c.pick(0, 3) + 16) / es};  // the seed's 16-byte base offset
  } else {
    t.address = kMovedAddress + 16;  // the data address itself off by 16 bytes
    t.storage_offset = Elements{0};
  }
  texts.push_back(fmt::format("recurrent_kda state pool breaks the compiled stride contract: {} base "
                              "byte offset {} (data address {:#x}) must be a multiple of 32",
                              pool.name, t.storage_offset.count * es, data_address(t)));
}

void overlap_pool_slots(Pool pool, Chooser& c, std::vector<std::string>& texts) {
  const i64 HV = heads(pool), VK = head_elements(pool);
  restride_pool(pool, HV * VK - 16 * c.pick(1, 4), VK);
  texts.push_back(fmt::format("{} slot stride {} is smaller than a slot, HV*V*K = {}", pool.name,
                              pool.view.stride[pool.inner - 1], HV * VK));
}

}  // namespace kdaguard::support::view_edits
