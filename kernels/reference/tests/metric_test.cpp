// The error metric every conformance check uses: rms(out - ref) / rms(ref), passing outright at a
// largest absolute error <= 1e-6, never passing with a NaN.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "kdaguard/reference.h"

namespace kdaguard::reference {
namespace {

TEST(ErrorMetric, RmsRatioOfTheDifference) {
  const std::vector<double> ref{3.0, -4.0};  // rms^2 = 12.5
  const std::vector<double> out{3.0, -4.5};  // diff rms^2 = 0.125
  const ErrorStats s = compare(out, ref);
  EXPECT_DOUBLE_EQ(s.rms_ratio, 0.1);
  EXPECT_DOUBLE_EQ(s.max_abs, 0.5);
  EXPECT_EQ(s.count, 2u);
  EXPECT_TRUE(s.pass(0.1));
  EXPECT_FALSE(s.pass(0.099));
}

TEST(ErrorMetric, SmallAbsoluteErrorPassesWhateverTheRatio) {
  const std::vector<double> ref{1e-9, 0.0};
  const std::vector<double> out{0.0, 1e-6};
  const ErrorStats s = compare(out, ref);
  EXPECT_GT(s.rms_ratio, 1.0);
  EXPECT_TRUE(s.pass(1e-12));
  const ErrorStats t = compare(std::vector<double>{0.0, 2e-6}, ref);
  EXPECT_FALSE(t.pass(1e-12));
}

TEST(ErrorMetric, ZeroReferenceWithErrorIsInfinitelyWrong) {
  const ErrorStats s = compare(std::vector<double>{1.0}, std::vector<double>{0.0});
  EXPECT_TRUE(std::isinf(s.rms_ratio));
  EXPECT_FALSE(s.pass(1e6));
  EXPECT_TRUE(compare(std::vector<double>{0.0}, std::vector<double>{0.0}).pass(0.0));
}

TEST(ErrorMetric, NanOrInfinityNeverPasses) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_FALSE(compare(std::vector<double>{nan, 1.0}, std::vector<double>{1.0, 1.0}).pass(1e9));
  EXPECT_FALSE(compare(std::vector<double>{1.0, 1.0}, std::vector<double>{nan, 1.0}).pass(1e9));
  EXPECT_FALSE(compare(std::vector<double>{nan}, std::vector<double>{nan}).pass(1e9));
  EXPECT_FALSE(compare(std::vector<double>{inf}, std::vector<double>{inf}).pass(1e9));
}

TEST(ErrorMetric, LengthMismatchNeverPasses) {
  EXPECT_FALSE(compare(std::vector<double>{1.0}, std::vector<double>{1.0, 2.0}).pass(1e9));
}

}  // namespace
}  // namespace kdaguard::reference
