#include "autobatch/vocabulary/training_spec.h"

#include <array>

#include "vocabulary/name_table.h"

namespace autobatch {
namespace {

constexpr std::array<detail::NameEntry<LossKind>, 4> kLossNames{{
    {LossKind::kMean, "mean"},
    {LossKind::kCrossEntropy, "cross-entropy"},
    {LossKind::kMse, "mse"},
    {LossKind::kModel, "model"},
}};

constexpr std::array<detail::NameEntry<OptimizerKind>, 5> kOptimizerNames{{
    {OptimizerKind::kNone, "none"},
    {OptimizerKind::kSgd, "sgd"},
    {OptimizerKind::kSgdMomentum, "sgd-momentum"},
    {OptimizerKind::kAdam, "adam"},
    {OptimizerKind::kAdamW, "adamw"},
}};

constexpr std::array<detail::NameEntry<Precision>, 5> kPrecisionNames{{
    {Precision::kFp32, "fp32"},
    {Precision::kAmpFp16, "amp-fp16"},
    {Precision::kAmpBf16, "amp-bf16"},
    {Precision::kFp16, "fp16"},
    {Precision::kBf16, "bf16"},
}};

constexpr std::array<detail::NameEntry<OptimizerImpl>, 4> kOptimizerImplNames{{
    {OptimizerImpl::kAuto, "auto"},
    {OptimizerImpl::kLoop, "loop"},
    {OptimizerImpl::kForeach, "foreach"},
    {OptimizerImpl::kFused, "fused"},
}};

constexpr std::array<detail::NameEntry<ZeroGrad>, 2> kZeroGradNames{{
    {ZeroGrad::kNone, "none"},
    {ZeroGrad::kZeros, "zeros"},
}};

}  // namespace

std::string_view toString(OptimizerImpl impl) { return detail::nameOf(kOptimizerImplNames, impl); }
std::string_view toString(ZeroGrad mode) { return detail::nameOf(kZeroGradNames, mode); }
OptimizerImpl parseOptimizerImpl(std::string_view name) {
  return detail::parseName(kOptimizerImplNames, "optimizer implementation", name);
}
ZeroGrad parseZeroGrad(std::string_view name) {
  return detail::parseName(kZeroGradNames, "zero-grad mode", name);
}

std::string_view toString(LossKind kind) { return detail::nameOf(kLossNames, kind); }
std::string_view toString(OptimizerKind kind) { return detail::nameOf(kOptimizerNames, kind); }
std::string_view toString(Precision precision) {
  return detail::nameOf(kPrecisionNames, precision);
}

LossKind parseLossKind(std::string_view name) {
  return detail::parseName(kLossNames, "loss", name);
}
OptimizerKind parseOptimizerKind(std::string_view name) {
  return detail::parseName(kOptimizerNames, "optimizer", name);
}
Precision parsePrecision(std::string_view name) {
  return detail::parseName(kPrecisionNames, "precision", name);
}

}  // namespace autobatch
