// Choices from a fuzzer's bytes, and the way back: a recorder that writes the bytes which make a
// FuzzedDataProvider-driven target repeat a given sequence of choices (seed corpora).
#pragma once

#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <vector>

#include "gen_calls.h"

namespace kdaguard::support {

// Every pick reads an integer from the end of the input (FuzzedDataProvider's convention); once
// the bytes run out every pick is its simplest value.
class FuzzChooser final : public Chooser {
 public:
  explicit FuzzChooser(FuzzedDataProvider& data) : data_(data) {}
  std::int64_t pick(std::int64_t lo, std::int64_t hi) override {
    return hi <= lo ? lo : data_.ConsumeIntegralInRange<std::int64_t>(lo, hi);
  }

 private:
  FuzzedDataProvider& data_;
};

// Takes its picks from `source` and records them so that FuzzChooser, reading bytes(), makes the
// same picks. ConsumeIntegralInRange(lo, hi) reads ceil(bits(hi - lo) / 8) bytes from the end of
// the input, most significant first; a pick whose range is one value reads nothing.
class RecordingChooser final : public Chooser {
 public:
  explicit RecordingChooser(Chooser& source) : source_(source) {}
  std::int64_t pick(std::int64_t lo, std::int64_t hi) override {
    const std::int64_t value = source_.pick(lo, hi);
    if (hi <= lo) return value;
    const std::uint64_t range = static_cast<std::uint64_t>(hi) - static_cast<std::uint64_t>(lo);
    const std::uint64_t offset = static_cast<std::uint64_t>(value) - static_cast<std::uint64_t>(lo);
    int bytes = 0;
    while (bytes < 8 && (range >> (8 * bytes)) > 0) ++bytes;
    for (int i = bytes - 1; i >= 0; --i)
      read_order_.push_back(static_cast<std::uint8_t>(offset >> (8 * i)));
    return value;
  }
  // The input: bytes in file order (the first pick's bytes last).
  std::vector<std::uint8_t> bytes() const { return {read_order_.rbegin(), read_order_.rend()}; }

 private:
  Chooser& source_;
  std::vector<std::uint8_t> read_order_;  // in the order FuzzedDataProvider reads them
};

}  // namespace kdaguard::support
