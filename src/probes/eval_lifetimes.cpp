// Python lifetimes for the evaluation forward (eval_lifetimes.h): the forward's graph inlined call
// by call, so that every node's frame instance is known, then a `keep_alive` use of each tensor
// at the point where a CPython frame would let it go.
#include "probes/eval_lifetimes.h"

#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/passes/inliner.h>
#include <torch/csrc/jit/runtime/custom_operator.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace autobatch::detail {
namespace {

using torch::jit::Block;
using torch::jit::GraphFunction;
using torch::jit::Node;
using torch::jit::Value;

// The use that keeps its arguments alive: its kernel does nothing. CONSERVATIVE alias analysis
// marks it as having side effects (Node::hasSideEffects, for ops outside aten:: and prim::), so
// dead-code elimination and the executor's passes keep it.
const torch::jit::RegisterOperators kRegisterKeepAlive({torch::jit::Operator(
    "autobatch::keep_alive(Tensor[] values) -> ()",
    [](torch::jit::Stack& stack) { stack.pop_back(); }, c10::AliasAnalysisKind::CONSERVATIVE)});

bool isTensor(const Value* value) { return value->type()->cast<c10::TensorType>() != nullptr; }

// The Python local a value is bound to, or "" for a temporary. The compiler names a value after
// its source variable (`x.3`: base `x`); the serialized code that torch.jit.load compiles again
// numbers a rebound local (`x`, `x0`, `x1`) and names temporaries `_0`, `_1`.
std::string localName(const Value* value) {
  if (!value->hasDebugName() || !isTensor(value)) return "";
  std::string name = value->debugNameBase();
  while (!name.empty() && std::isdigit(static_cast<unsigned char>(name.back())) != 0) {
    name.pop_back();
  }
  return name == "_" ? "" : name;
}

// A name bound in a frame instance at a node: the value it holds from `at` on.
struct Binding {
  Value* value;
  int frame;
  std::string name;
  Node* at;
};

class LifetimePass {
 public:
  explicit LifetimePass(torch::jit::Graph& graph) : graph_(graph) {}

  std::int64_t run() {
    Block* top = graph_.block();
    inlineRange(*top->nodes().begin(), top->return_node(), 0);
    for (const Binding& b : bindings_) by_name_[{b.frame, b.name}].push_back(&b);
    for (const Binding& b : bindings_) keepThrough(b.value, bindingEnd(b));
    return insertKeepAlives();
  }

 private:
  // Inlines every call from `first` up to (not including) `stop`, in the frame `frame`,
  // recording the bindings and the arguments' extensions as it goes.
  void inlineRange(Node* first, Node* stop, int frame) {
    for (Node* n = first; n != stop;) {
      Node* next = n->next();
      if (GraphFunction* callee = torch::jit::tryToGraphFunction(n)) {
        inlineCall(n, callee, frame);
      } else {
        for (Value* out : n->outputs()) bind(out, frame, n);
        for (Block* b : n->blocks()) inlineRange(*b->nodes().begin(), b->return_node(), frame);
      }
      n = next;
    }
  }

  void inlineCall(Node* call, GraphFunction* callee, int frame) {
    Node* before = call->prev();
    Node* after = call->next();
    std::vector<std::string> names;
    for (const Value* out : call->outputs()) names.push_back(localName(out));
    if (call->kind() == c10::prim::CallFunction) call->removeInput(0);  // the function constant
    std::vector<Value*> arguments;
    for (Value* in : call->inputs()) {
      if (isTensor(in)) arguments.push_back(in);
    }
    callee->ensure_defined();
    // The raw graph (not optimized_graph(), which is inlined already): its calls are inlined
    // below, each a frame of its own.
    const std::vector<Value*> outputs =
        torch::jit::inlineCallTo(call, callee, callee->graph().get());
    // The outputs may come from calls in the callee, inlined below (their values replaced): a
    // node that uses them follows the replacements, and goes once they are known.
    Node* sentinel = graph_.create(c10::prim::TupleConstruct, outputs, /*num_outputs=*/0);
    sentinel->insertBefore(after);
    const int child = next_frame_++;
    inlineRange(before->next(), sentinel, child);
    const std::vector<Value*> results(sentinel->inputs().begin(), sentinel->inputs().end());
    sentinel->destroy();
    Node* last = after->prev();
    if (last == before) return;  // nothing ran in the call: no point to keep anything through
    frame_end_[child] = last;
    // Python holds a call's arguments until it returns.
    for (Value* argument : arguments) keepThrough(argument, last);
    for (std::size_t i = 0; i < outputs.size(); ++i) {
      if (!names[i].empty()) bindings_.push_back({results[i], frame, names[i], last});
    }
  }

  void bind(Value* value, int frame, Node* at) {
    std::string name = localName(value);
    if (!name.empty()) bindings_.push_back({value, frame, std::move(name), at});
  }

  // The node through which Python holds `b`: the next binding of its name in its frame and
  // block, else the end of its frame (in that block), else the end of the block.
  Node* bindingEnd(const Binding& b) const {
    const Block* block = b.at->owningBlock();
    Node* rebound = nullptr;
    for (const Binding* other : by_name_.at({b.frame, b.name})) {
      if (other->at->owningBlock() != block || !b.at->isBefore(other->at)) continue;
      if (rebound == nullptr || other->at->isBefore(rebound)) rebound = other->at;
    }
    if (rebound != nullptr) return rebound;
    const auto end = frame_end_.find(b.frame);
    if (end != frame_end_.end() && end->second->owningBlock() == block) return end->second;
    return block->return_node()->prev();
  }

  void keepThrough(Value* value, Node* through) {
    std::vector<Value*>& values = kept_[through];
    if (std::find(values.begin(), values.end(), value) == values.end()) values.push_back(value);
  }

  // One `keep_alive([values])` after each node that ends a lifetime; returns the uses made.
  std::int64_t insertKeepAlives() {
    std::int64_t count = 0;
    const c10::Symbol keep_alive = c10::Symbol::fromQualString("autobatch::keep_alive");
    for (auto& [through, values] : kept_) {
      Node* list = graph_.createList(c10::TensorType::get(), values);
      list->insertAfter(through);
      Node* use = graph_.create(keep_alive, /*num_outputs=*/0);
      use->addInput(list->output());
      use->insertAfter(list);
      count += static_cast<std::int64_t>(values.size());
    }
    return count;
  }

  torch::jit::Graph& graph_;
  int next_frame_ = 1;  // frame 0: forward itself
  std::vector<Binding> bindings_;
  std::map<std::pair<int, std::string>, std::vector<const Binding*>> by_name_;  // frame, name
  std::map<int, Node*> frame_end_;  // an inlined frame: its last node, in the caller's block
  std::map<Node*, std::vector<Value*>> kept_;  // node -> values held through it
};

}  // namespace

PythonLifetimeForward pythonLifetimeForward(const torch::jit::Module& module) {
  const torch::jit::Method forward = module.get_method("forward");
  std::shared_ptr<torch::jit::Graph> graph =
      torch::jit::toGraphFunction(forward.function()).graph()->copy();
  PythonLifetimeForward out;
  out.kept_values = LifetimePass(*graph).run();
  out.function = std::make_unique<GraphFunction>(
      c10::QualifiedName("__autobatch__.python_lifetime_forward"), graph, nullptr);
  return out;
}

}  // namespace autobatch::detail
