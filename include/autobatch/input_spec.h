// autobatch/input_spec.h — what one forward argument of the model looks like.
//
// The trial runner builds a synthetic tensor per InputSpec: shape [micro_batch, sample_shape...],
// the given dtype, values in [low, high) for integer dtypes (memory does not depend on values).
// This header includes no LibTorch header (the parsers are fuzzed without LibTorch).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace autobatch {

/// Element type of a synthetic input. Sizes: float32 4, float16 2, bfloat16 2, int64 8, int32 4,
/// bool 1 byte.
enum class DType { kFloat32, kFloat16, kBFloat16, kInt64, kInt32, kBool };

/// "float32", "float16", "bfloat16", "int64", "int32", "bool".
std::string_view toString(DType dtype);

/// Parses a dtype name (as printed by toString; also "fp32", "fp16", "bf16", "long", "int").
/// Throws: autobatch::Error listing the valid names.
DType parseDType(std::string_view name);

/// Bytes per element of `dtype` (see DType).
std::int64_t elementBytes(DType dtype);

/// True for the integer dtypes and bool (inputs that carry ids or labels, not activations).
bool isIntegral(DType dtype);

/// One forward argument, for ONE sample: the batch dimension is added in front by the runner.
struct InputSpec {
  /// Shape of one sample, e.g. {3, 224, 224} for an image or {512} for a token sequence.
  /// Every dimension >= 1; may be empty (a scalar per sample, tensor shape [batch]).
  std::vector<std::int64_t> sample_shape;
  DType dtype = DType::kFloat32;
  /// Value range [low, high) of integer inputs (e.g. token ids below a vocabulary size).
  /// Ignored for floating dtypes, whose values are standard normal. Default: [0, 2).
  std::int64_t low = 0;
  std::int64_t high = 2;

  bool operator==(const InputSpec&) const = default;
};

}  // namespace autobatch
