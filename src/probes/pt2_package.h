// pt2_package.h (internal) — the second model format: an AOTInductor package of one training step
// written by scripts/autobatch_export.py --format pt2 (issue 19, docs/formats.md).
//
// The package's call takes the inputs then the loss's targets (one batch dimension shared by all)
// and returns the loss then one gradient per parameter name in metadata "gradients". Its weights
// are not compiled in: they are stored in the archive (data/autobatch/weights.pt) and supplied
// here with load_constants(..., user_managed=true), so the package computes with the runner's own
// tensors (held once; an optimizer step and a restore act on what the package reads).
// Thread safety: one thread at a time.
#pragma once

#include <ATen/Tensor.h>
#include <c10/core/Storage.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "probes/pt2_metadata.h"

namespace autobatch::detail {

class Pt2Model;          // one compiled model of the package, loaded (pt2_package.cpp)
class Pt2StoredTensors;  // the stored weights by name, tied copies resolved (pt2_package.cpp)

/// True when `path` is a zip archive with a data/aotinductor/ entry (an AOTInductor package),
/// whoever wrote it. False for anything else (a TorchScript archive, a plain torch.export
/// program, not a zip). Never throws.
bool isAotiPackage(const std::string& path);

/// True when `path` is a torch.export program archive (torch.export.save: models/*.json, no
/// compiled code): neither format autobatch runs. Never throws.
bool isExportProgram(const std::string& path);

/// A loaded package with its weights. Construct under detail::UntrackedCpuScope when its weights
/// should not be counted (the runner counts them as baseline afterwards).
class Pt2Package {
 public:
  /// Loads `path` (checked by readPt2Metadata: a whole zip archive first) on the CPU. The
  /// compiled libraries are written into a folder "autobatch-pt2-XXXXXX" under $TMPDIR (else
  /// /tmp), loaded by LibTorch's CPU runner, and the folder is removed before the constructor
  /// returns or throws (registered meanwhile for autobatch::removeScratchFiles()). Throws
  /// autobatch::Error for a damaged package (a missing compiled model, weights.pt that does not
  /// read) and for stored weights that do not match what its code asks for; c10::Error from
  /// LibTorch's runner (dlopen).
  explicit Pt2Package(const std::string& path);
  ~Pt2Package();
  Pt2Package(const Pt2Package&) = delete;
  Pt2Package& operator=(const Pt2Package&) = delete;

  const Pt2Metadata& metadata() const { return metadata_; }
  /// The distinct parameters (one per tied group), requires_grad set; what the optimizer trains.
  const std::vector<at::Tensor>& parameters() const { return parameters_; }
  /// The buffers (BatchNorm running stats, updated in place by the call).
  const std::vector<at::Tensor>& buffers() const { return buffers_; }
  /// For output i + 1 of run() (the gradient of metadata().gradients[i]): its index in
  /// parameters(); tied copies map to their group's stored parameter.
  const std::vector<std::size_t>& gradientOwners() const { return gradient_owners_; }
  /// Why the package cannot run `batch` (outside metadata().batch_low..batch_high), else "".
  std::string batchOutOfRange(std::int64_t batch) const;
  /// The error the model's eager step raises at micro-batch `batch`, as recorded at export
  /// (Pt2Metadata::eager_batch1_error, batch 1 only); "" when it runs.
  std::string eagerStepError(std::int64_t batch) const;

  /// One forward-backward: `inputs` are the model's inputs then the targets, all with the same
  /// leading batch size. Returns the loss then the gradients (new tensors). Throws c10::Error as
  /// LibTorch's loader does (an allocation refused inside the call is a plain error there).
  std::vector<at::Tensor> run(const std::vector<at::Tensor>& inputs);

  /// True when the package has an accumulating model and every trained parameter's gradient is
  /// defined with the parameter's sizes, strides, dtype and device (the layout the compiled code
  /// writes). Frozen parameters (no gradient in the package) do not count.
  bool canAccumulate() const;
  /// One forward-backward that adds each gradient into its parameter's .grad inside the call, as
  /// an eager backward does (no second set of gradients held at the end of the call). Requires
  /// canAccumulate(). Returns the loss. Side effects: the .grad tensors and the BatchNorm buffers
  /// are updated in place. Throws as run() does.
  at::Tensor runAccumulating(const std::vector<at::Tensor>& inputs);

 private:
  static std::vector<at::Tensor> call(Pt2Model& loader, const std::vector<at::Tensor>& inputs);
  // The constructor's steps: the parameters, buffers and gradient owners from the stored tensors
  // (returns each stored parameter's index in parameters_); the accumulating model's weights and
  // gradient slots; the check that every trained parameter has one slot.
  std::map<std::string, std::size_t> bindParameters(const std::string& path,
                                                    Pt2StoredTensors& tensors);
  void bindAccumulating(const std::string& path, const Pt2StoredTensors& tensors,
                        const std::map<std::string, std::size_t>& index);
  void checkGradientBuffers(const std::string& path) const;

  Pt2Metadata metadata_;
  std::unique_ptr<Pt2Model> loader_;
  std::unique_ptr<Pt2Model> accumulate_loader_;
  /// The accumulating model's gradient buffers: the constant's name, the parameter (index in
  /// parameters_), and the tensor given for it, whose storage points at that parameter's .grad
  /// during a call only.
  struct Slot {
    std::string name;
    std::size_t parameter = 0;
    c10::Storage storage;
    at::Tensor tensor;
  };
  std::vector<Slot> accumulate_into_;
  static void pointSlot(c10::Storage& storage, void* data);
  std::vector<at::Tensor> parameters_;
  std::vector<at::Tensor> buffers_;
  std::vector<std::size_t> gradient_owners_;
};

}  // namespace autobatch::detail
