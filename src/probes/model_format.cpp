#include "autobatch/probes/model_format.h"

#include <filesystem>

#include "probes/pt2_package.h"

namespace autobatch {

const ModelFormat& torchScriptFormat() {
  static const ModelFormat format{
      .name = "torchscript",
      .file_kind = "archive",
      .cpu_only = false,
      .cpu_only_reason = "",
      .inputs_fixed = false,
      .returns_output = true,
      .capabilities = {.evaluation_forward = true,
                       .varying_shapes = true,
                       .accumulates_in_call = false},
  };
  return format;
}

const ModelFormat& pt2Format() {
  static const ModelFormat format{
      .name = "pt2",
      .file_kind = "package",
      .cpu_only = true,
      .cpu_only_reason =
          "pt2 packages run on the CPU only until a GPU has run one (export the "
          "TorchScript format for CUDA)",
      .inputs_fixed = true,
      .returns_output = false,
      .capabilities = {.evaluation_forward = false,
                       .varying_shapes = false,
                       .accumulates_in_call = true},
  };
  return format;
}

const ModelFormat& modelFormatAt(const std::string& path) {
  const bool package =
      !path.empty() && std::filesystem::is_regular_file(path) && detail::isAotiPackage(path);
  return package ? pt2Format() : torchScriptFormat();
}

}  // namespace autobatch
