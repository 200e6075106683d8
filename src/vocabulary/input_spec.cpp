#include "autobatch/vocabulary/input_spec.h"

#include <algorithm>
#include <array>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "autobatch/vocabulary/error.h"
#include "autobatch/vocabulary/units.h"
#include "vocabulary/name_table.h"

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

namespace autobatch {
namespace {

constexpr std::string_view kSyntax =
    "[DTYPE:]SHAPE[:RANGE], e.g. 3x224x224, bf16:3x224x224, int64:512:<32000 (see docs/inputs.md)";

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

[[noreturn]] void fail(std::string_view text, const std::string& expected, std::string_view got,
                       std::string_view fix = {}) {
  std::string message = "input spec '" + std::string(text) + "': expected " + expected +
                        ", but got '" + std::string(got) + "'";
  if (!fix.empty()) message += "; " + std::string(fix);
  throw Error(message);
}

// Parses a decimal integer with an optional leading '-'; nullopt on anything else or overflow.
std::optional<std::int64_t> parseInt(std::string_view s) {
  if (s.empty()) return std::nullopt;
  bool negative = false;
  if (s.front() == '-') {
    negative = true;
    s.remove_prefix(1);
  } else if (s.front() == '+') {
    s.remove_prefix(1);
  }
  if (s.empty()) return std::nullopt;
  std::int64_t value = 0;
  for (const char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    const std::int64_t digit = c - '0';
    if (value > (std::numeric_limits<std::int64_t>::max() - digit) / 10) return std::nullopt;
    value = value * 10 + digit;
  }
  return negative ? -value : value;
}

bool looksLikeShape(std::string_view s) {
  if (s == "scalar") return true;
  return !s.empty() && ((s.front() >= '0' && s.front() <= '9') || s.front() == '-');
}

std::vector<std::int64_t> parseShape(std::string_view text, std::string_view shape,
                                     std::int64_t element_bytes) {
  std::vector<std::int64_t> dims;
  if (shape == "scalar") return dims;
  if (shape.empty()) {
    fail(text, "a sample shape such as 3x224x224 (or 'scalar')", shape, kSyntax);
  }
  std::int64_t bytes = element_bytes;
  std::size_t start = 0;
  while (true) {
    const std::size_t end = shape.find('x', start);
    const std::string_view dim =
        shape.substr(start, end == std::string_view::npos ? std::string_view::npos : end - start);
    const auto value = parseInt(dim);
    if (!value && !dim.empty() &&
        std::all_of(dim.begin(), dim.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      fail(text, "every dimension at most 9223372036854775807 (INT64_MAX)", dim,
           "one sample of that size cannot even be counted, let alone allocated");
    }
    if (!value) {
      fail(text, "dimensions that are positive integers joined by 'x'", dim,
           "write the shape of one sample, e.g. 3x224x224");
    }
    if (*value < 1) {
      fail(text, "every dimension >= 1", dim,
           "the batch dimension is added by autobatch; give the shape of one sample");
    }
    if (bytes > std::numeric_limits<std::int64_t>::max() / *value) {
      fail(text, "a sample of at most INT64_MAX bytes", shape,
           "one sample's element count times its element size overflows int64");
    }
    bytes *= *value;
    dims.push_back(*value);
    if (end == std::string_view::npos) break;
    start = end + 1;
  }
  return dims;
}

// Parses `text`; error messages name `shown` (the text as the user wrote it, before a sweep put
// its length in for L).
InputSpec parseSpecShown(std::string_view text, std::string_view shown) {
  if (text.empty()) fail(shown, "an input spec " + std::string(kSyntax), std::string_view{});

  // Split on ':' into at most three fields.
  std::vector<std::string_view> fields;
  std::size_t start = 0;
  while (true) {
    const std::size_t end = text.find(':', start);
    fields.push_back(trim(
        text.substr(start, end == std::string_view::npos ? std::string_view::npos : end - start)));
    if (end == std::string_view::npos) break;
    start = end + 1;
  }
  if (fields.size() > 3)
    fail(shown, "at most three ':'-separated fields " + std::string(kSyntax), shown);

  InputSpec spec;
  std::size_t next = 0;
  if (!looksLikeShape(fields[0])) {
    try {
      spec.dtype = parseDType(fields[0]);
    } catch (const Error& e) {
      throw Error("input spec '" + std::string(shown) + "': " + e.what());
    }
    next = 1;
  }
  if (next >= fields.size()) {
    fail(shown,
         "a sample shape after the dtype, e.g. " + std::string(toString(spec.dtype)) + ":3x224x224",
         shown);
  }
  spec.sample_shape = parseShape(shown, fields[next], elementBytes(spec.dtype));
  ++next;
  if (next < fields.size()) {
    const std::string_view range = fields[next];
    if (!isIntegral(spec.dtype)) {
      fail(shown, "no value range for floating dtype " + std::string(toString(spec.dtype)), range,
           "ranges apply to integer inputs, e.g. int64:512:<32000");
    }
    std::optional<std::int64_t> low = 0;
    std::optional<std::int64_t> high;
    if (!range.empty() && range.front() == '<') {
      high = parseInt(range.substr(1));
    } else if (const std::size_t dots = range.find("..<"); dots != std::string_view::npos) {
      low = parseInt(range.substr(0, dots));
      high = parseInt(range.substr(dots + 3));
    }
    if (!low || !high) {
      fail(shown, "a range '<HIGH' or 'LOW..<HIGH' of integers", range,
           "e.g. <32000 for token ids below a vocabulary of 32000");
    }
    if (*high <= *low) {
      fail(shown, "a non-empty range (HIGH > LOW)", range, "values are drawn from [LOW, HIGH)");
    }
    if (spec.dtype == DType::kBool && (*low < 0 || *high > 2)) {
      fail(shown, "a bool range inside [0, 2)", range, "omit the range for bool inputs");
    }
    if (spec.dtype == DType::kInt32 && (*low < std::numeric_limits<std::int32_t>::min() ||
                                        *high - 1 > std::numeric_limits<std::int32_t>::max())) {
      fail(shown, "an int32 range within the int32 limits", range, "use int64 for larger values");
    }
    spec.low = *low;
    spec.high = *high;
  }
  return spec;
}

}  // namespace

InputSpec parseInputSpec(std::string_view text_in) {
  const std::string_view text = trim(text_in);
  return parseSpecShown(text, text);
}

std::vector<InputSpec> parseInputSpecs(std::string_view text) {
  std::vector<InputSpec> specs;
  if (trim(text).empty()) {
    throw Error("input specs: expected one or more specs separated by commas " +
                std::string(kSyntax) + ", but got an empty text");
  }
  std::size_t start = 0;
  while (true) {
    const std::size_t end = text.find(',', start);
    const std::string_view item =
        text.substr(start, end == std::string_view::npos ? std::string_view::npos : end - start);
    try {
      specs.push_back(parseInputSpec(item));
    } catch (const Error& e) {
      throw Error("input " + std::to_string(specs.size() + 1) + " of '" + std::string(text) +
                  "': " + e.what());
    }
    if (end == std::string_view::npos) break;
    start = end + 1;
  }
  return specs;
}

std::string toString(const InputSpec& spec) {
  std::string out(toString(spec.dtype));
  out += ':';
  if (spec.sample_shape.empty()) {
    out += "scalar";
  } else {
    for (std::size_t i = 0; i < spec.sample_shape.size(); ++i) {
      if (i > 0) out += 'x';
      out += std::to_string(spec.sample_shape[i]);
    }
  }
  if (isIntegral(spec.dtype) && !(spec.low == 0 && spec.high == 2)) {
    out += ':';
    if (spec.low != 0) out += std::to_string(spec.low) + "..";
    out += '<' + std::to_string(spec.high);
  }
  return out;
}

std::int64_t sampleElements(const InputSpec& spec) {
  std::int64_t n = 1;
  for (const auto d : spec.sample_shape) n *= d;
  return n;
}

std::optional<std::int64_t> batchBytes(const InputSpec& spec, std::int64_t batch,
                                       std::int64_t element_bytes) {
  if (batch < 1 || element_bytes < 1) {
    throw Error("input bytes: expected a micro-batch >= 1 and an element size >= 1, but got " +
                std::to_string(batch) + " and " + std::to_string(element_bytes));
  }
  std::int64_t bytes = element_bytes;
  for (const std::int64_t factor : spec.sample_shape) {
    if (factor < 1 || bytes > std::numeric_limits<std::int64_t>::max() / factor) {
      return std::nullopt;
    }
    bytes *= factor;
  }
  if (bytes > std::numeric_limits<std::int64_t>::max() / batch) return std::nullopt;
  return bytes * batch;
}

namespace {

// Splits `text` at every `sep`, keeping empty fields.
std::vector<std::string_view> split(std::string_view text, char sep) {
  std::vector<std::string_view> parts;
  std::size_t start = 0;
  while (true) {
    const std::size_t at = text.find(sep, start);
    parts.push_back(text.substr(start, at == std::string_view::npos ? at : at - start));
    if (at == std::string_view::npos) return parts;
    start = at + 1;
  }
}

constexpr std::int64_t kMaxLength = std::int64_t{1} << 20;

}  // namespace

namespace {

// The index of the shape among the ':'-fields of one spec: the first field when it reads as a
// shape (digits, "scalar", or dimensions that are L), else the second (after a dtype).
std::size_t shapeField(const std::vector<std::string_view>& fields) {
  if (looksLikeShape(trim(fields[0]))) return 0;
  for (const auto dim : split(trim(fields[0]), 'x')) {
    if (dim != "L" && !looksLikeShape(dim)) return 1;
  }
  return 0;
}

// Calls `visit(field, is_shape)` for each ':'-field of each comma-separated spec of `text`.
template <typename Visit>
void forEachField(std::string_view text, Visit visit) {
  for (const auto item : split(text, ',')) {
    const std::vector<std::string_view> fields = split(item, ':');
    const std::size_t shape = shapeField(fields);
    for (std::size_t i = 0; i < fields.size(); ++i) visit(fields[i], i == shape);
  }
}

// Whether `field` (a shape) has a dimension that is exactly L.
bool namesL(std::string_view field) {
  const auto dims = split(trim(field), 'x');
  return std::find(dims.begin(), dims.end(), "L") != dims.end();
}

}  // namespace

bool hasLengthPlaceholder(std::string_view text) {
  bool found = false;
  forEachField(text, [&found](std::string_view field, bool is_shape) {
    found = found || (is_shape && namesL(field));
  });
  return found;
}

std::string withLength(std::string_view text, std::int64_t length) {
  std::string out;
  bool first_item = true;
  for (const auto item : split(text, ',')) {
    if (!first_item) out += ',';
    first_item = false;
    const std::vector<std::string_view> fields = split(item, ':');
    const std::size_t shape = shapeField(fields);
    for (std::size_t i = 0; i < fields.size(); ++i) {
      if (i > 0) out += ':';
      if (i != shape) {
        out += fields[i];
        continue;
      }
      bool first_dim = true;
      for (const auto dim : split(fields[i], 'x')) {
        if (!first_dim) out += 'x';
        first_dim = false;
        out += trim(dim) == "L" ? std::to_string(length) : std::string(dim);
      }
    }
  }
  return out;
}

std::vector<InputSpec> parseInputSpecsAtLength(std::string_view text, std::int64_t length) {
  if (trim(text).empty()) return parseInputSpecs(text);  // its error
  std::vector<InputSpec> specs;
  for (const auto item : split(text, ',')) {
    const std::string where =
        "input " + std::to_string(specs.size() + 1) + " of '" + std::string(text) + "'" +
        (hasLengthPlaceholder(item) ? " at length " + std::to_string(length) : std::string()) +
        ": ";
    forEachField(item, [&](std::string_view field, bool is_shape) {
      if (!is_shape && field.find('L') != std::string_view::npos) {
        throw Error(where + "input spec '" + std::string(trim(item)) +
                    "': expected the length placeholder L only as a dimension of the sample "
                    "shape, but got it in '" +
                    std::string(trim(field)) +
                    "'; write the dtype and the value range without L (e.g. int64:L:<32000)");
      }
    });
    try {
      specs.push_back(parseSpecShown(trim(withLength(item, length)), trim(item)));
    } catch (const Error& e) {
      throw Error(where + e.what());
    }
  }
  return specs;
}

std::int64_t tokensPerSample(const std::vector<std::string>& texts, std::int64_t length) {
  for (const auto& text : texts) {
    for (const auto item : split(text, ',')) {
      if (!hasLengthPlaceholder(item)) continue;
      return sampleElements(parseInputSpecsAtLength(item, length).front());
    }
  }
  return 0;
}

std::vector<std::int64_t> parseLengths(std::string_view text) {
  const std::string bound = "--lengths (a length in [1, " + std::to_string(kMaxLength) + "])";
  std::vector<std::int64_t> lengths;
  if (const auto dots = text.find(".."); dots != std::string_view::npos) {
    const std::int64_t a = parseInteger(text.substr(0, dots), bound, 1, kMaxLength);
    const std::int64_t b = parseInteger(text.substr(dots + 2), bound, 1, kMaxLength);
    if (b < a) {
      throw Error("--lengths: expected a range A..B with A <= B, but got '" + std::string(text) +
                  "'");
    }
    lengths = {a, b};
    for (std::int64_t p = 1; p <= b; p *= 2) {
      if (p > a) lengths.push_back(p);
    }
  } else {
    for (const auto item : split(text, ',')) {
      if (item.empty()) {
        throw Error(
            "--lengths: expected a list like 128,512,1536 or a range like 128..2048, but "
            "got '" +
            std::string(text) + "'");
      }
      lengths.push_back(parseInteger(item, bound, 1, kMaxLength));
    }
  }
  std::sort(lengths.begin(), lengths.end(), std::greater<>());
  lengths.erase(std::unique(lengths.begin(), lengths.end()), lengths.end());
  return lengths;
}

}  // namespace autobatch
