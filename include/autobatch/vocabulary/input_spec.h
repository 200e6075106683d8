// autobatch/vocabulary/input_spec.h — what one forward argument of the model looks like.
//
// The trial runner builds a synthetic tensor per InputSpec: shape [micro_batch, sample_shape...],
// the given dtype, values in [low, high) for integer dtypes (memory does not depend on values).
// This header includes no LibTorch header (the parsers are fuzzed without LibTorch).
#pragma once

#include <cstdint>
#include <optional>
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

namespace autobatch {

/// Parses the text form of ONE input (the CLI's `--input` value, see docs/inputs.md):
///
///     [DTYPE:]SHAPE[:RANGE]
///     DTYPE  float32 (default) | float16 | bfloat16 | int64 | int32 | bool  (aliases fp32, fp16,
///            bf16, long, int)
///     SHAPE  the shape of one sample, dimensions joined by 'x' ("3x224x224", "512"), or "scalar"
///            for one value per sample (tensor shape [batch])
///     RANGE  integer dtypes only: "<HIGH" for values in [0, HIGH) or "LOW..<HIGH" for [LOW, HIGH)
///
/// Examples: "3x224x224", "bf16:3x224x224", "int64:512:<32000", "int64:scalar:<1000",
/// "int32:16x16:-5..<5". Spaces around the text are ignored.
/// Returns: the spec; integer inputs without a range get [0, 2) (bool always [0, 2)).
/// Throws: autobatch::Error "input spec 'TEXT': expected ..., but got ...; ..." for an empty spec,
/// a dimension that is not a positive integer (zero, negative, not a number), an element count or
/// byte size of one sample above INT64_MAX, an unknown dtype (listing the valid names), a range on
/// a floating dtype, an empty range (HIGH <= LOW), or a bool range outside [0, 2).
/// Thread safety: pure function.
InputSpec parseInputSpec(std::string_view text);

/// Parses several inputs separated by commas, one per forward argument in order:
/// "3x224x224,int64:scalar:<1000". Throws: as parseInputSpec, naming the position (1-based) of
/// the bad spec; an empty list is an error.
std::vector<InputSpec> parseInputSpecs(std::string_view text);

/// The canonical text of `spec` that parseInputSpec reads back, e.g. "int64:512:<32000",
/// "float32:3x224x224", "int32:scalar:-5..<5".
std::string toString(const InputSpec& spec);

/// The sequence-length placeholder of a length sweep (docs/sweeps.md): a dimension of the sample
/// shape written "L" ("int64:L:<32000", "Lx64", "bool:L", "2xL"). True when the shape of some
/// comma-separated spec of `text` has a dimension that is exactly "L" (an L elsewhere, as in a
/// range "<L", is not a placeholder: parseInputSpecsAtLength refuses it). Thread safety: pure.
bool hasLengthPlaceholder(std::string_view text);

/// `text` with every "L" dimension of a sample shape replaced by `length`, e.g.
/// ("int64:L:<32000", 512) -> "int64:512:<32000". Other text (dtypes, ranges) is unchanged.
/// Thread safety: pure function.
std::string withLength(std::string_view text, std::int64_t length);

/// parseInputSpecs of `text` with L = `length` (withLength), whose errors name the text as given
/// ("input spec 'int64:L:<L'", not the text after the substitution) and the length.
/// Throws: autobatch::Error as parseInputSpecs, and "expected the length placeholder L only as a
/// dimension of the sample shape, but got it in '<L'" for an L in a dtype or a range (tokens ids
/// below the length would make the range change with it; give the range as numbers).
std::vector<InputSpec> parseInputSpecsAtLength(std::string_view text, std::int64_t length);

/// Tokens of one sample at `length` (docs/sweeps.md "Tokens"): the element count of one sample of
/// the first input in `texts` (each one --input text, specs separated by commas) whose shape
/// names L, at L = `length`: "int64:L" -> L, "int64:2xL" -> 2L, "int64:LxL" -> L*L; with
/// "int64:L:<32000,bool:LxL" the token ids (first) give L and the mask is not counted.
/// Returns 0 when no input names L. Throws: as parseInputSpecsAtLength.
std::int64_t tokensPerSample(const std::vector<std::string>& texts, std::int64_t length);

/// Parses the CLI's --lengths: a list "128,512,1536" (each a whole number in [1, 2^20]) or a
/// range "A..B" (1 <= A <= B <= 2^20) meaning the powers of two in [A, B] plus A and B.
/// Returns: the lengths from longest to shortest, without repeats.
/// Throws: autobatch::Error "--lengths: expected ..., but got ..." otherwise.
std::vector<std::int64_t> parseLengths(std::string_view text);

/// Elements of one sample (product of sample_shape; 1 for a scalar sample).
std::int64_t sampleElements(const InputSpec& spec);

/// Bytes of the input `spec` at micro-batch `batch`: batch x the sample's elements x
/// `element_bytes` (the size the runner feeds it in: a float32 input of an fp16 model is 2).
/// Returns: nullopt when the product passes INT64_MAX, so no allocator can even be asked for it
/// (the trial runner calls that batch out of memory before allocating anything: issue 27, row 13).
/// Throws: autobatch::Error for batch < 1 or element_bytes < 1. Thread safety: pure function.
std::optional<std::int64_t> batchBytes(const InputSpec& spec, std::int64_t batch,
                                       std::int64_t element_bytes);

}  // namespace autobatch
