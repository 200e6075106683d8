#include <gtest/gtest.h>

#include "autobatch/vocabulary/error.h"
#include "autobatch/vocabulary/input_spec.h"
#include "autobatch/vocabulary/search_options.h"
#include "autobatch/vocabulary/training_spec.h"
#include "autobatch/vocabulary/trial.h"

namespace autobatch {
namespace {
// Named after the file: the test executables compile several files as one unit (UNITY_BUILD).
namespace names_test {

TEST(NamesTest, EveryPrecisionRoundTrips) {
  for (auto p : {Precision::kFp32, Precision::kAmpFp16, Precision::kAmpBf16, Precision::kFp16,
                 Precision::kBf16}) {
    EXPECT_EQ(parsePrecision(toString(p)), p);
  }
  EXPECT_EQ(toString(Precision::kAmpBf16), "amp-bf16");
}

TEST(NamesTest, EveryOptimizerAndLossRoundTrips) {
  for (auto o : {OptimizerKind::kNone, OptimizerKind::kSgd, OptimizerKind::kSgdMomentum,
                 OptimizerKind::kAdam, OptimizerKind::kAdamW}) {
    EXPECT_EQ(parseOptimizerKind(toString(o)), o);
  }
  for (auto l : {LossKind::kMean, LossKind::kCrossEntropy, LossKind::kMse, LossKind::kModel}) {
    EXPECT_EQ(parseLossKind(toString(l)), l);
  }
  EXPECT_EQ(parseStrategy("binsearch"), Strategy::kBinsearch);
  EXPECT_EQ(parsePlanKind("balanced"), PlanKind::kBalanced);
  for (auto k : {PlanKind::kAuto, PlanKind::kUniform, PlanKind::kBalanced, PlanKind::kFastest}) {
    EXPECT_EQ(parsePlanKind(toString(k)), k);
  }
}

TEST(NamesTest, UnknownNameListsTheValidOnes) {
  try {
    parsePrecision("fp8");
    FAIL() << "expected autobatch::Error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "unknown precision 'fp8': expected one of fp32, amp-fp16, amp-bf16, fp16, bf16");
  }
  try {
    parseDType("half");
    FAIL() << "expected autobatch::Error";
  } catch (const Error& e) {
    // Aliases (fp16, long, ...) are accepted but not listed.
    EXPECT_STREQ(e.what(),
                 "unknown dtype 'half': expected one of float32, float16, bfloat16, int64, int32, "
                 "bool");
  }
}

TEST(NamesTest, DTypeAliasesAndSizes) {
  EXPECT_EQ(parseDType("bf16"), DType::kBFloat16);
  EXPECT_EQ(parseDType("long"), DType::kInt64);
  EXPECT_EQ(elementBytes(DType::kBFloat16), 2);
  EXPECT_EQ(elementBytes(DType::kInt64), 8);
  EXPECT_EQ(elementBytes(DType::kBool), 1);
  EXPECT_TRUE(isIntegral(DType::kInt32));
  EXPECT_FALSE(isIntegral(DType::kFloat16));
}

TEST(NamesTest, OutcomeNames) {
  EXPECT_EQ(toString(TrialOutcome::kOutOfMemory), "out-of-memory");
  EXPECT_EQ(toString(TrialOutcome::kSizeLimit), "size-limit");
}

}  // namespace names_test
}  // namespace
}  // namespace autobatch
