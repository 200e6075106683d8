#include "autobatch/input_spec.h"

#include <array>

#include "name_table.h"

namespace autobatch {
namespace {

// Canonical names first; the aliases after them are accepted but never listed.
constexpr std::array<detail::NameEntry<DType>, 11> kDTypeNames{{
    {DType::kFloat32, "float32"},
    {DType::kFloat16, "float16"},
    {DType::kBFloat16, "bfloat16"},
    {DType::kInt64, "int64"},
    {DType::kInt32, "int32"},
    {DType::kBool, "bool"},
    {DType::kFloat32, "fp32"},
    {DType::kFloat16, "fp16"},
    {DType::kBFloat16, "bf16"},
    {DType::kInt64, "long"},
    {DType::kInt32, "int"},
}};

}  // namespace

std::string_view toString(DType dtype) { return detail::nameOf(kDTypeNames, dtype); }

DType parseDType(std::string_view name) { return detail::parseName(kDTypeNames, "dtype", name); }

std::int64_t elementBytes(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
    case DType::kInt32:
      return 4;
    case DType::kFloat16:
    case DType::kBFloat16:
      return 2;
    case DType::kInt64:
      return 8;
    case DType::kBool:
      return 1;
  }
  return 0;
}

bool isIntegral(DType dtype) {
  return dtype == DType::kInt64 || dtype == DType::kInt32 || dtype == DType::kBool;
}

}  // namespace autobatch
