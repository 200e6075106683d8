// pt2_archive.h (internal) — what reading a pt2 package's metadata (pt2_metadata.cpp) and
// loading its code (pt2_package.cpp) share: the records scripts/autobatch_export.py writes, the
// wording of a failed check, the records of one compiled model, and the check of the compiled code
// before LibTorch's loader maps it. Thread safety: none needed (no state).
#pragma once

#include <string>
#include <vector>

namespace caffe2::serialize {
class PyTorchStreamReader;
}  // namespace caffe2::serialize

namespace autobatch::detail {

/// The key of the package's own metadata among AOTInductor's (a JSON object of texts).
inline constexpr const char* kMetadataKey = "autobatch";
inline constexpr const char* kWeightsRecord = "data/autobatch/weights.pt";
inline constexpr const char* kBatchRangeRecord = "data/autobatch/batch_range.json";
inline constexpr const char* kMemoryCheckRecord = "data/autobatch/memory_check.json";
inline constexpr const char* kDamagedAdvice =
    "copy the file again, or export it again with scripts/autobatch_export.py --format pt2";
inline constexpr const char* kAdvice =
    "export the model with scripts/autobatch_export.py --format pt2 (or use the TorchScript "
    "format)";

/// Throws autobatch::Error "model package '<path>': <what>".
[[noreturn]] void failPackage(const std::string& path, const std::string& what);

/// The records of compiled model `model` (names as the reader gives them, without the archive's
/// folder): data/aotinductor/<model>/... The slash matters: LibTorch's loader took "model" to
/// include "model2/".
std::vector<std::string> modelRecords(caffe2::serialize::PyTorchStreamReader& reader,
                                      const std::string& model);

/// Checks every compiled library (.so) in the package before LibTorch's loader maps it. Throws
/// autobatch::Error naming the library and its damage (cut short, another machine, not ELF).
void checkCompiledCode(const std::string& path, caffe2::serialize::PyTorchStreamReader& reader);

}  // namespace autobatch::detail
