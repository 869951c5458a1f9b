// Random call descriptions and random bytes for the round-trip and robustness tests. Every test
// run draws fresh ones; KDAGUARD_TEST_SEED=<n> replays a run (the seed is printed on failure).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "kdaguard/callio.h"

namespace kdaguard::callio::testing_support {

inline std::uint64_t test_seed() {
  if (const char* text = std::getenv("KDAGUARD_TEST_SEED")) return std::strtoull(text, nullptr, 10);
  return (static_cast<std::uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
}

class Random {
 public:
  explicit Random(std::uint64_t seed) : engine_(seed) {}

  std::uint64_t bits() { return engine_(); }
  bool coin(double p = 0.5) { return std::bernoulli_distribution(p)(engine_); }
  std::int64_t between(std::int64_t lo, std::int64_t hi) {
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(engine_);
  }
  template <class T> const T& pick(const std::vector<T>& items) {
    return items[static_cast<std::size_t>(between(0, static_cast<std::int64_t>(items.size()) - 1))];
  }

  // Mostly small sizes, sometimes the edges: negatives, zero, huge, the int64 limits.
  std::int64_t size_like() {
    switch (between(0, 9)) {
      case 0: return between(-4, -1);
      case 1: return std::numeric_limits<std::int64_t>::max() - between(0, 3);
      case 2: return std::numeric_limits<std::int64_t>::min() + between(0, 3);
      case 3: return static_cast<std::int64_t>(bits());
      case 4: return std::int64_t{1} << between(20, 62);
      default: return between(0, 8);
    }
  }

  // Any double, the non-finite ones and the odd ones included.
  double real() {
    switch (between(0, 6)) {
      case 0: return std::numeric_limits<double>::infinity();
      case 1: return -std::numeric_limits<double>::infinity();
      case 2: return std::numeric_limits<double>::quiet_NaN();
      case 3: return std::numeric_limits<double>::denorm_min() * static_cast<double>(between(1, 9));
      case 4: return -0.0;
      case 5: {
        double x = 0;
        const std::uint64_t b = bits();
        std::memcpy(&x, &b, sizeof x);
        return x;
      }
      default: return std::uniform_real_distribution<double>(-10, 10)(engine_);
    }
  }

 private:
  std::mt19937_64 engine_;
};

// A tensor view the JSON format can describe (anything a TensorView holds, except values that
// disagree with the dtype or the element count, which the format refuses by design).
inline TensorView random_view(Random& random) {
  TensorView view;
  view.dtype = static_cast<DType>(random.between(0, 4));
  view.rank = static_cast<int>(random.between(0, kMaxRank));
  const bool small = random.coin(0.6);
  for (int d = 0; d < view.rank; ++d) {
    view.shape[d] = small ? random.between(0, 5) : random.size_like();
    view.stride[d] = random.coin(0.7) ? random.between(0, 64) : random.size_like();
  }
  if (random.coin()) view.storage_offset.count = random.size_like();
  if (random.coin()) view.address = random.coin() ? random.bits() : random.bits() & ~0xffull;
  if (random.coin(0.3)) view.storage_size = Elements{random.size_like()};
  if (random.coin(0.3))
    view.device = random.coin() ? Device{Device::Kind::cpu, 0}
                                : Device{Device::Kind::cuda, static_cast<int>(random.between(0, 7))};
  if (view.dtype == DType::i32 || view.dtype == DType::i64) {
    std::int64_t numel = 1;
    bool known = true;
    for (int d = 0; d < view.rank && known; ++d)
      known = view.shape[d] >= 0 && !__builtin_mul_overflow(numel, view.shape[d], &numel);
    if (random.coin() && (!known || numel <= 64)) {
      std::vector<std::int64_t> values(static_cast<std::size_t>(known ? numel : random.between(0, 5)));
      for (std::int64_t& x : values)
        x = view.dtype == DType::i32 ? random.between(std::numeric_limits<std::int32_t>::min(),
                                                      std::numeric_limits<std::int32_t>::max())
                                     : static_cast<std::int64_t>(random.bits());
      view.values = std::move(values);
    }
  }
  return view;
}

inline CatalogueCall random_call(Random& random) {
  const auto entry = static_cast<Entry>(random.between(0, kEntryCount - 1));
  CatalogueCall call = make_catalogue_call(entry);
  for_each_argument(call, [&](Arg, OptionalView& slot) {
    if (random.coin(0.6)) slot = random_view(random);
  });
  const Device device = random.coin() ? Device{Device::Kind::cpu, 0}
                                      : Device{Device::Kind::cuda, static_cast<int>(random.between(0, 3))};
  std::visit([&](auto& c) { c.device = device; }, call);
  Scalars& scalars = scalars_of(call);
  if (entry_takes(entry, Arg::q)) {  // the entry points that take scale, lower_bound, l2norm
    if (random.coin()) scalars.scale = random.real();
    if (random.coin()) scalars.lower_bound = random.real();
    scalars.use_qk_l2norm = random.coin();
  }
  if (rule_info(RuleId::verify_draft_tokens).applies_to(entry) && random.coin(0.8))
    scalars.draft_token_num = random.size_like();
  return call;
}

// Bytes a JSON parser has to survive: uniform noise, or a soup of JSON-ish tokens.
inline std::string random_bytes(Random& random) {
  std::string bytes(static_cast<std::size_t>(random.between(0, 300)), '\0');
  for (char& c : bytes) c = static_cast<char>(random.between(0, 255));
  return bytes;
}

inline std::string random_token_soup(Random& random) {
  static const std::vector<std::string> tokens = {
      "{", "}", "[", "]", ",", ":", " ", "\n", "\r\n", "\"entry\"", "\"decode\"", "\"verify\"",
      "\"prefill\"", "\"commit\"", "\"tensors\"", "\"scalars\"", "\"q\"", "\"state\"",
      "\"cache_indices\"", "\"dtype\"", "\"bf16\"", "\"i32\"", "\"shape\"", "\"stride\"",
      "\"values\"", "\"address\"", "\"storage_offset\"", "\"storage_size\"", "\"device\"",
      "\"cuda:0\"", "\"scale\"", "\"draft_token_num\"", "0", "1", "-1", "128", "2.5", "1e999",
      "-9223372036854775809", "18446744073709551616", "9223372036854775807", "null", "true",
      "\"\\u0000\"", "\"\\ud800\"", "\xff", "\xc3\xa9", "\"", "\\", "[[[[[[[[", "]]]]]]]]"};
  std::string text;
  const std::int64_t count = random.between(0, 80);
  for (std::int64_t i = 0; i < count; ++i) text += random.pick(tokens);
  return text;
}

// A valid document with a few random edits: byte flips, insertions, deletions, duplicated or
// truncated spans, numbers swapped for extreme ones.
inline std::string mutated(Random& random, std::string text) {
  static const std::vector<std::string> numbers = {
      "-1", "0", "3", "1e999", "-0", "2.5", "9223372036854775808", "-9223372036854775809",
      "18446744073709551615", "99999999999999999999999", "4294967296", "[]", "null", "\"x\""};
  const std::int64_t edits = random.between(1, 8);
  for (std::int64_t e = 0; e < edits; ++e) {
    const auto size = static_cast<std::int64_t>(text.size());
    const auto at = static_cast<std::size_t>(random.between(0, size));
    switch (random.between(0, 6)) {
      case 0:
        if (at < text.size()) text[at] = static_cast<char>(random.between(0, 255));
        break;
      case 1: text.insert(at, 1, static_cast<char>(random.between(0, 255))); break;
      case 2: text.erase(at, static_cast<std::size_t>(random.between(0, 16))); break;
      case 3: {
        const std::string span = text.substr(at, static_cast<std::size_t>(random.between(0, 64)));
        text.insert(static_cast<std::size_t>(random.between(0, size)), span);
        break;
      }
      case 4: text.resize(at); break;
      default: {  // replace the run of digits at or after `at` by another number
        const std::size_t begin = text.find_first_of("0123456789", at);
        if (begin == std::string::npos) break;
        const std::size_t end = text.find_first_not_of("0123456789", begin);
        text.replace(begin, (end == std::string::npos ? text.size() : end) - begin,
                     random.pick(numbers));
      }
    }
  }
  return text;
}

}  // namespace kdaguard::callio::testing_support
