// Tiny TorchScript models built in C++ for the trial runner tests (seeded, CPU).
#pragma once

#include <torch/script.h>
#include <torch/torch.h>

namespace autobatch::testing {

inline torch::jit::Module newModule(const char* name) {
  torch::jit::Module m(name);
  m.register_attribute("training", c10::BoolType::get(), true);
  return m;
}

inline void param(torch::jit::Module& m, const char* name, const torch::Tensor& t) {
  m.register_parameter(name, t.clone().requires_grad_(), false);
}

/// x [B, in] -> [B, classes]: tanh(x @ w1) @ w2.
inline torch::jit::Module mlp(std::int64_t in, std::int64_t hidden, std::int64_t classes) {
  torch::manual_seed(0);
  auto m = newModule("Mlp");
  param(m, "w1", torch::randn({in, hidden}) * 0.1);
  param(m, "w2", torch::randn({hidden, classes}) * 0.1);
  m.define(R"(
    def forward(self, x):
        return torch.matmul(torch.tanh(torch.matmul(x, self.w1)), self.w2)
  )");
  return m;
}

/// x [B, 3, S, S] -> [B, 10]: conv-BN-ReLU-conv-ReLU-mean-fc; BatchNorm running stats as buffers.
inline torch::jit::Module convNet(std::int64_t channels = 16) {
  torch::manual_seed(0);
  auto m = newModule("ConvNet");
  param(m, "c1w", torch::randn({channels, 3, 3, 3}) * 0.1);
  param(m, "c1b", torch::zeros({channels}));
  param(m, "bnw", torch::ones({channels}));
  param(m, "bnb", torch::zeros({channels}));
  m.register_buffer("rm", torch::zeros({channels}));
  m.register_buffer("rv", torch::ones({channels}));
  param(m, "c2w", torch::randn({channels, channels, 3, 3}) * 0.1);
  param(m, "c2b", torch::zeros({channels}));
  param(m, "fc", torch::randn({channels, 10}) * 0.1);
  m.define(R"(
    def forward(self, x):
        y = torch.conv2d(x, self.c1w, self.c1b, [1, 1], [1, 1])
        y = torch.batch_norm(y, self.bnw, self.bnb, self.rm, self.rv, self.training, 0.1, 1e-5, False)
        y = torch.relu(y)
        y = torch.relu(torch.conv2d(y, self.c2w, self.c2b, [1, 1], [1, 1]))
        return torch.matmul(torch.mean(y, [2, 3]), self.fc)
  )");
  return m;
}

/// x [B, 3, S, S] -> [B, 10]: three conv-ReLU layers (no BatchNorm), mean, fc.
inline torch::jit::Module plainConvNet(std::int64_t channels = 32) {
  torch::manual_seed(0);
  auto m = newModule("PlainConvNet");
  param(m, "c1w", torch::randn({channels, 3, 3, 3}) * 0.1);
  param(m, "c2w", torch::randn({channels, channels, 3, 3}) * 0.05);
  param(m, "c3w", torch::randn({channels, channels, 3, 3}) * 0.05);
  param(m, "fc", torch::randn({channels, 10}) * 0.1);
  m.define(R"(
    def forward(self, x):
        y = torch.relu(torch.conv2d(x, self.c1w, None, [1, 1], [1, 1]))
        y = torch.relu(torch.conv2d(y, self.c2w, None, [1, 1], [1, 1]))
        y = torch.relu(torch.conv2d(y, self.c3w, None, [1, 1], [1, 1]))
        return torch.matmul(torch.mean(y, [2, 3]), self.fc)
  )");
  return m;
}

/// ids [B, T] (int64 < vocab) -> logits [B, T, vocab]: one pre-LN-free transformer block with
/// single-head attention, GELU MLP and tied embedding output.
inline torch::jit::Module tinyTransformer(std::int64_t vocab = 512, std::int64_t dim = 64) {
  torch::manual_seed(0);
  auto m = newModule("TinyTransformer");
  param(m, "emb", torch::randn({vocab, dim}) * 0.02);
  param(m, "wq", torch::randn({dim, dim}) * 0.05);
  param(m, "wk", torch::randn({dim, dim}) * 0.05);
  param(m, "wv", torch::randn({dim, dim}) * 0.05);
  param(m, "wo", torch::randn({dim, dim}) * 0.05);
  param(m, "lnw", torch::ones({dim}));
  param(m, "lnb", torch::zeros({dim}));
  param(m, "w1", torch::randn({dim, 4 * dim}) * 0.05);
  param(m, "w2", torch::randn({4 * dim, dim}) * 0.05);
  m.define(R"(
    def forward(self, ids):
        x = torch.embedding(self.emb, ids)
        q = torch.matmul(x, self.wq)
        k = torch.matmul(x, self.wk)
        v = torch.matmul(x, self.wv)
        a = torch.softmax(torch.matmul(q, k.transpose(1, 2)) * 0.125, -1)
        x = x + torch.matmul(torch.matmul(a, v), self.wo)
        x = torch.layer_norm(x, [x.size(-1)], self.lnw, self.lnb, 1e-5, False)
        x = x + torch.matmul(torch.gelu(torch.matmul(x, self.w1)), self.w2)
        return torch.matmul(x, self.emb.t())
  )");
  return m;
}

}  // namespace autobatch::testing
