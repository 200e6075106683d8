"""Builds the pt2 packages (torch.export + AOTInductor, issue 19) that the pt2 tests and benchmarks
use, on demand, into a cache under the environment root.

    python scripts/pt2_packages.py [--root DIR] NAME [NAME ...]

prints one line per name: ``NAME PATH`` (the package, or the TorchScript archive for a name ending
in ``.ts``). The cache folder is ``$AUTOBATCH_ENV_ROOT/pt2/<key>`` (default root
``~/.cache/autobatch``), where the key hashes this script, the export's code (src/python/autobatch/_export/) and export_models.py,
the torch version and the CPU instruction set Inductor compiles for: a package is built once per
key and reused (about 15-80 s each on 2 cores cold). Not run by bootstrap or the demo.

Names:
  mlp_tiny            Linear(8,16)-tanh-Linear(16,4), cross-entropy (the API test's model)
  frozen_tiny         mlp_tiny with l1.weight frozen (requires_grad off: no gradient)
  convbn_tiny         conv-BN-ReLU-conv-ReLU-pool-fc at 3x16x16, cross-entropy (BatchNorm buffers)
  bn1d_tiny           Linear(8,16)-BatchNorm1d-tanh-Linear(16,4): its eager step fails at batch 1
  tied_lm_tiny        embedding 64x16 tied to the output head, T=8, cross-entropy
  mlp_wide_tiny       64-256-256-256-4 ReLU MLP, cross-entropy: 0.6 MB of weights at batch 4
  resnet18_64         torchvision ResNet-18 at 3x64x64, cross-entropy
  mobilenet_v3_large_64, mlp_8x2048, decoder_lm_small   as in export_models.py (the LM untied)
  decoder_lm_small_1024   decoder_lm_small with a context of 1024 tokens
  resnet18_64_fused   resnet18_64 exported as before eager kernels (VARIANTS): core ATen's
                      decompositions fused by Inductor, Inductor's own peak-memory reordering
  resnet18_64_reordered, mobilenet_v3_large_64_reordered   eager kernels kept, Inductor's own
                      peak-memory reordering instead of autograd's order (VARIANTS)
  <name>.ts           the same model and inputs as a TorchScript archive (side-by-side checks)
  program_only        a torch.export program (torch.export.save), not a compiled package
  inference_package   an AOTInductor package of the forward only, without autobatch metadata
  other_torch, other_isa, other_machine   mlp_tiny with its metadata saying torch 2.10.0, the
                      NEON instruction set, an aarch64 machine (what a package from elsewhere says)
  narrow_range        mlp_tiny saying its compiled batch range is 2 to 8 (as Inductor's guards
                      could leave a package; ResNet-18 ran 2 to 15 before _hinted_conv_backend)
  wrong_weights       mlp_tiny whose weights.pt holds l1.weight as 32x8 (compiled for 16x8)
  inverted_range      mlp_tiny saying its compiled batch range is 10 to 3
  malformed_range     mlp_tiny whose batch_range.json gives "low" as text ("2")
  fused_package       mlp_tiny without metadata "eager_kernels" (as exported before packages ran
                      eager's kernels: the runner warns that its figures are a fused step's)
  truncated_so        mlp_tiny with its compiled library (.so) cut short inside a valid zip
  foreign_so          mlp_tiny whose compiled library's ELF header names another machine
  blank_batch1_error  mlp_tiny whose batch_range.json holds a blank eager batch-1 error
  memory_unchecked, memory_over, memory_predates, memory_malformed   mlp_tiny whose
                      memory_check.json says the check did not run, says 4% over at batch 12, is
                      absent (exported before the check), holds a status the export never writes
  @tests              the set tests/probes/pt2_test.cpp uses (TEST_SET)
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time

import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import autobatch_export as ab  # noqa: E402
import export_models as em  # noqa: E402


class MlpTiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(8, 16)
        self.l2 = nn.Linear(16, 4)

    def forward(self, x):
        return self.l2(torch.tanh(self.l1(x)))


def _mlp_wide_tiny():
    """Parameter-heavy for its activations (0.6 MB of weights, batch 4): what the gradient
    accumulation's timing shows in."""
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                         nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 4))


def _frozen_tiny():
    model = MlpTiny()
    model.l1.weight.requires_grad_(False)  # fine-tuning style: a frozen layer gets no gradient
    return model


class ConvBnTiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 16, 3, padding=1)
        self.bn = nn.BatchNorm2d(16)
        self.c2 = nn.Conv2d(16, 16, 3, padding=1)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        x = torch.relu(self.bn(self.c1(x)))
        x = torch.relu(self.c2(x))
        return self.fc(x.mean(dim=(2, 3)))


class MlpBnTiny(nn.Module):
    """BatchNorm1d on the features: its eager step fails at batch 1 ("Expected more than 1 value
    per channel when training"), which the compiled package alone would run."""

    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(8, 16)
        self.bn = nn.BatchNorm1d(16)
        self.l2 = nn.Linear(16, 4)

    def forward(self, x):
        return self.l2(torch.tanh(self.bn(self.l1(x))))


class TiedLmTiny(nn.Module):
    def __init__(self, vocab=64, width=16):
        super().__init__()
        self.emb = nn.Embedding(vocab, width)
        self.mix = nn.Linear(width, width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids):
        return self.head(torch.relu(self.mix(self.emb(ids))))


def _vision64(name):
    def make():
        import torchvision

        return (getattr(torchvision.models, name)(weights=None), (torch.randn(2, 3, 64, 64),),
                "cross-entropy", None)
    return make


class UNetSmall(nn.Module):
    """A small U-Net of the kind issue 26 measured (+3.26% as a package before its fix): GroupNorm,
    SiLU, a stride-2 conv down, ConvTranspose2d up, a concatenated skip, a 1x1 conv out, MSE."""

    def __init__(self, width: int = 32):
        super().__init__()

        def block(cin, cout):
            return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.GroupNorm(8, cout),
                                 nn.SiLU(), nn.Conv2d(cout, cout, 3, padding=1),
                                 nn.GroupNorm(8, cout), nn.SiLU())

        self.enc1 = block(3, width)
        self.down = nn.Conv2d(width, 2 * width, 3, stride=2, padding=1)
        self.enc2 = block(2 * width, 2 * width)
        self.up = nn.ConvTranspose2d(2 * width, width, 2, stride=2)
        self.dec = block(2 * width, width)
        self.out = nn.Conv2d(width, 3, 1)

    def forward(self, x):
        skip = self.enc1(x)
        x = self.enc2(self.down(skip))
        return self.out(self.dec(torch.cat([self.up(x), skip], dim=1)))


class LogitsOnly(nn.Module):
    """A Hugging Face causal LM as a module that returns its logits tensor: torch.jit.trace and
    torch.export take tensors, not a CausalLMOutputWithPast (issue 29). ``use_cache=False``: a
    training step keeps no key/value cache."""

    def __init__(self, lm: nn.Module):
        super().__init__()
        self.lm = lm

    def forward(self, ids):
        return self.lm(input_ids=ids, use_cache=False).logits


def _hf_lm(kind: str):
    """A small GPT-2 or Llama from a config (transformers, nothing downloaded): 2 layers, width
    256, 4 heads, vocabulary 8000, 128 tokens; PyTorch's attention (sdpa), training mode."""
    def make():
        import transformers

        if kind == "gpt2":
            config = transformers.GPT2Config(n_layer=2, n_embd=256, n_head=4, vocab_size=8000,
                                             n_positions=128, attn_implementation="sdpa")
            lm = transformers.GPT2LMHeadModel(config)
        else:
            config = transformers.LlamaConfig(hidden_size=256, intermediate_size=688,
                                              num_hidden_layers=2, num_attention_heads=4,
                                              num_key_value_heads=4, vocab_size=8000,
                                              max_position_embeddings=128,
                                              attn_implementation="sdpa")
            lm = transformers.LlamaForCausalLM(config)
        return (LogitsOnly(lm.train()), (torch.randint(0, 8000, (2, 128)),), "cross-entropy",
                {0: 8000})
    return make


def _vit_small_64():
    import torchvision

    model = torchvision.models.VisionTransformer(image_size=64, patch_size=8, num_layers=4,
                                                 num_heads=4, hidden_dim=256, mlp_dim=1024)
    return (model, (torch.randn(2, 3, 64, 64),), "cross-entropy", None)


# The wider fidelity set (issue 26, item 4; scripts/bench/fidelity.py --set wide): models as users
# build them (default stochastic depth and dropout), at small resolutions and lengths.
WIDE_MODELS = {
    "convnext_tiny_64": _vision64("convnext_tiny"),
    "efficientnet_b0_64": _vision64("efficientnet_b0"),
    "regnet_y_400mf_64": _vision64("regnet_y_400mf"),
    "swin_t_64": _vision64("swin_t"),
    "vit_small_64": _vit_small_64,
    "densenet121_64": _vision64("densenet121"),
    "shufflenet_v2_64": _vision64("shufflenet_v2_x1_0"),
    "unet_96": lambda: (UNetSmall(), (torch.randn(2, 3, 96, 96),), "mse", None),
    "gpt2_lm_small": _hf_lm("gpt2"),
    "llama_lm_small": _hf_lm("llama"),
}
# Models that torch.jit.script cannot compile (Hugging Face's): their TorchScript archive traced.
TRACED = {"gpt2_lm_small", "llama_lm_small"}

MODELS = {
    "mlp_tiny": lambda: (MlpTiny(), (torch.randn(3, 8),), "cross-entropy", None),
    "frozen_tiny": lambda: (_frozen_tiny(), (torch.randn(3, 8),), "cross-entropy", None),
    "mlp_wide_tiny": lambda: (_mlp_wide_tiny(), (torch.randn(4, 64),), "cross-entropy", None),
    "convbn_tiny": lambda: (ConvBnTiny(), (torch.randn(2, 3, 16, 16),), "cross-entropy", None),
    "bn1d_tiny": lambda: (MlpBnTiny(), (torch.randn(3, 8),), "cross-entropy", None),
    "tied_lm_tiny": lambda: (TiedLmTiny(), (torch.randint(0, 64, (2, 8)),), "cross-entropy",
                             {0: 64}),
    "resnet18_64": _vision64("resnet18"),
    "mobilenet_v3_large_64": _vision64("mobilenet_v3_large"),
    "mlp_8x2048": em.MODELS["mlp_8x2048"],
    "decoder_lm_small": em.MODELS["decoder_lm_small"],
    "decoder_lm_small_1024": lambda: em.decoder_lm_small(1024),
    **WIDE_MODELS,
}


# A package built another way than export_pt2's, for comparisons recorded in docs/formats.md
# (reproduced with scripts/bench/formats.py --package NAME; its NAME.ts is the model's
# TorchScript archive): name -> (MODELS name, what differs). "fused": no EAGER_KERNELS, Inductor's
# own reordering and fusion, dropout as torch.export decomposes it, as packages were exported
# before eager kernels (written without "eager_kernels", so the runner warns). "reordered": EAGER_KERNELS kept, Inductor's own
# reordering instead of _eager_order.
VARIANTS = {
    "resnet18_64_fused": ("resnet18_64", "fused"),
    "resnet18_64_reordered": ("resnet18_64", "reordered"),
    "mobilenet_v3_large_64_reordered": ("mobilenet_v3_large_64", "reordered"),
}


# What tests/probes/pt2_test.cpp needs: built by the ctest fixture Pt2Packages.Build and, timed, by
# scripts/test.sh before ctest.
TEST_SET = ["mlp_tiny", "frozen_tiny", "convbn_tiny", "convbn_tiny.ts", "bn1d_tiny", "bn1d_tiny.ts",
            "tied_lm_tiny", "mlp_wide_tiny", "mlp_wide_tiny.ts", "program_only",
            "inference_package", "other_torch", "other_isa", "other_machine", "narrow_range",
            "wrong_weights", "inverted_range", "malformed_range", "truncated_so", "foreign_so",
            "blank_batch1_error", "fused_package", "memory_unchecked", "memory_over",
            "memory_predates", "memory_malformed"]

# mlp_tiny with one metadata field changed: (AOTInductor key or "autobatch.<field>", value).
REWRITES = {
    "other_torch": ("autobatch.torch", "2.10.0"),
    "other_isa": ("AOTI_CPU_ISA", "NEON"),
    "other_machine": ("AOTI_MACHINE", "aarch64"),
    "narrow_range": ("batch_range", '{"low": 2, "high": 8}'),
    "inverted_range": ("batch_range", '{"low": 10, "high": 3}'),
    # a batch range whose low is text: the message names the field and its value
    "malformed_range": ("batch_range", '{"low": "2", "high": null}'),
    # a package as exported before packages ran eager's kernels (no "eager_kernels" field)
    "fused_package": ("autobatch.eager_kernels", None),
    # weights.pt holding l1.weight at twice its rows: the compiled code would read the first half
    "wrong_weights": ("weights.model.l1.weight", "32x8"),
    # the plain model's compiled library cut to 60% of its bytes, inside a valid zip
    "truncated_so": ("so", "0.6"),
    # its ELF header saying AArch64 (e_machine 183): dlopen said "No such file or directory"
    "foreign_so": ("so_machine", "183"),
    # the export's memory check (issue 26): not run, with its reason; over by 4% at batch 12;
    # absent, as in packages exported before the check; a status it never writes
    "memory_unchecked": ("memory_check", '{"status": "not-run", "rows": [], "reason": '
                                         '"no autobatch executable was found"}'),
    "memory_over": ("memory_check", '{"status": "over", "reason": null, "rows": [{"batch": 3, '
                                    '"eager_peak_bytes": 1000, "package_peak_bytes": 1001}, '
                                    '{"batch": 12, "eager_peak_bytes": 50000, '
                                    '"package_peak_bytes": 52000}]}'),
    "memory_predates": ("memory_check", None),
    "memory_malformed": ("memory_check", '{"status": "under", "rows": []}'),
    # an eager batch-1 error of blanks (autobatch_export.py writes "Type: message" or null)
    "blank_batch1_error": ("batch_range", '{"low": 2, "high": null, "eager_batch1_error": " \\n "}'),
}


def rewrite_metadata(src: str, dst: str, key: str, value: str) -> None:
    """Copies the package at src to dst with one field of its metadata JSON changed."""
    import json
    import zipfile

    with zipfile.ZipFile(src) as a, zipfile.ZipFile(dst, "w") as b:
        for info in a.infolist():
            data = a.read(info.filename)
            if key == "batch_range":
                if info.filename.endswith(ab.PT2_BATCH_RANGE):
                    data = value.encode()
            elif key == "memory_check":
                if info.filename.endswith(ab.PT2_MEMORY_CHECK):
                    if value is None:
                        continue  # a package from before the check: no record
                    data = value.encode()
            elif key in ("so", "so_machine"):
                # the plain model's library only (the accumulating model's stays whole)
                if info.filename.endswith(".so") and \
                        f"/{ab.PT2_ACCUMULATE_MODEL}/" not in info.filename:
                    if key == "so":
                        data = data[:int(len(data) * float(value))]
                    else:  # e_machine, 2 bytes at offset 18 of the ELF header
                        data = data[:18] + int(value).to_bytes(2, "little") + data[20:]
            elif key.startswith("weights."):
                if info.filename.endswith(ab.PT2_WEIGHTS):
                    import io
                    state = torch.load(io.BytesIO(data))
                    state[key.split(".", 1)[1]] = torch.zeros([int(d) for d in value.split("x")])
                    buffer = io.BytesIO()
                    torch.save(state, buffer)
                    data = buffer.getvalue()
            elif info.filename.endswith("_metadata.json"):
                meta = json.loads(data)
                if key.startswith("autobatch."):
                    inner = json.loads(meta[ab.PT2_METADATA_KEY])
                    if value is None:
                        inner.pop(key.split(".", 1)[1], None)
                    else:
                        inner[key.split(".", 1)[1]] = value
                    meta[ab.PT2_METADATA_KEY] = json.dumps(inner)
                else:
                    meta[key] = value
                data = json.dumps(meta).encode()
            b.writestr(info, data)


def cache_key() -> str:
    digest = hashlib.sha256()
    # The export's code is in the package (the modules of src/python/autobatch/_export/,
    # ab.SOURCES; the shim in scripts/ only loads them): hash the files that hold it.
    for name in ("pt2_packages.py", *ab.SOURCES, "export_models.py"):
        with open(os.path.join(HERE, name), "rb") as f:
            digest.update(f.read())
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    isa = str(pick_vec_isa()).replace(" ", "_") or "none"
    return f"{digest.hexdigest()[:12]}-torch{torch.__version__.split('+')[0]}-{isa}"


def build(name: str, path: str) -> None:
    import torch._inductor  # noqa: F401  (torch.export and aoti_compile_and_package need it loaded)

    torch.manual_seed(0)
    if name in REWRITES:
        source = os.path.join(os.path.dirname(path), "mlp_tiny.pt2")
        if not os.path.exists(source):
            build("mlp_tiny", source)
        rewrite_metadata(source, path, *REWRITES[name])
        return
    if name == "program_only":
        model = MlpTiny()
        ep = torch.export.export(model, (torch.randn(3, 8),))
        torch.export.save(ep, path)
        return
    if name == "inference_package":
        model = MlpTiny().eval()
        ep = torch.export.export(model, (torch.randn(3, 8),))
        torch._inductor.aoti_compile_and_package(ep, package_path=path)
        return
    torchscript = name.endswith(".ts")
    base, variant = VARIANTS.get(name[:-3] if torchscript else name, (None, None))
    model, example, loss, int_high = MODELS[base or (name[:-3] if torchscript else name)]()
    if torchscript:
        # The pt2 export unties shared weights; the TorchScript archive keeps the model as it is.
        base_name = name[:-3]
        ab.export(model, path, example, loss=loss, int_high=int_high,
                  method="trace" if base_name in TRACED else "script")
    elif variant in ("fused", "reordered"):
        import contextlib

        patches = ab.inductor_patches  # where the export reads them
        kernels, order = patches.EAGER_KERNELS, patches._eager_order
        buffers, dropout = patches._eager_buffers, patches._eager_dropout
        patches._eager_order = contextlib.nullcontext
        if variant == "fused":
            patches.EAGER_KERNELS = ()
            patches._eager_buffers = patches._eager_dropout = contextlib.nullcontext
            # Inductor's defaults
            ab._INDUCTOR_OVERRIDES.update(max_fusion_size=64, allow_buffer_reuse=True)
        staged = path[:-len(".pt2")] + ".variant.pt2"
        try:
            # a variant differs from the eager step on purpose (docs/formats.md compares them):
            # the memory check would refuse it, so it says it was not run
            ab.export_pt2(model, staged, example, loss=loss, int_high=int_high,
                          check_memory=False)
        finally:
            patches.EAGER_KERNELS, patches._eager_order = kernels, order
            patches._eager_buffers, patches._eager_dropout = buffers, dropout
            for key in ("max_fusion_size", "allow_buffer_reuse"):
                ab._INDUCTOR_OVERRIDES.pop(key, None)
        if variant == "fused":
            rewrite_metadata(staged, path, "autobatch.eager_kernels", None)
            os.remove(staged)
        else:
            os.replace(staged, path)
    else:
        ab.export_pt2(model, path, example, loss=loss, int_high=int_high)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", default=os.environ.get(
        "AUTOBATCH_ENV_ROOT", os.path.join(os.path.expanduser("~"), ".cache", "autobatch")))
    parser.add_argument("names", nargs="+")
    args = parser.parse_args()
    folder = os.path.join(args.root, "pt2", cache_key())
    os.makedirs(folder, exist_ok=True)
    names = []
    for name in args.names:
        names += TEST_SET if name == "@tests" else [name]
    for name in names:
        base = name[:-3] if name.endswith(".ts") else name
        if base not in MODELS and base not in VARIANTS and \
                name not in ("program_only", "inference_package", *REWRITES):
            print(f"pt2_packages: unknown name '{name}': expected one of "
                  f"{', '.join(sorted([*MODELS, *VARIANTS]))}, program_only, inference_package "
                  f"(or NAME.ts)",
                  file=sys.stderr)
            return 2
        path = os.path.join(folder, name + (".pt" if name.endswith(".ts") else ".pt2"))
        if not os.path.exists(path):
            start = time.time()
            partial = path + f".partial-{os.getpid()}" + (".pt" if name.endswith(".ts") else ".pt2")
            build(name, partial)
            os.replace(partial, path)  # concurrent builders: the last rename wins, both whole
            print(f"pt2_packages: built {name} in {time.time() - start:.1f} s", file=sys.stderr)
        print(f"{name} {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
