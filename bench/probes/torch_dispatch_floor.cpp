// torch's own share of an eager call of a kdaguard op: kernels that only take and release their
// arguments through KDAGUARD_BOX (python/csrc/boxing.h), for an op with decode's schema and for
// an op without arguments. bench/torch_overhead.py --probe loads this library, defines the two
// ops (decode's schema read from torch.ops.kdaguard.decode) and times them beside the real op. A
// measurement behind python/NOTES.md, built as torch_dispatch_floor wherever the PyTorch module
// is built (python/CMakeLists.txt); not installed.
#include "boxing.h"

namespace {

using kdaguard::torch_binding::OptTensor;
using kdaguard::torch_binding::Tensor;

// decode's parameters in its schema's order (python/csrc/ops.cpp); a schema that has changed
// fails KDAGUARD_BOX's argument count check on the first call.
void decode_nothing(const Tensor&, const Tensor&, const Tensor&, const OptTensor&, const OptTensor&,
                    const OptTensor&, const OptTensor&, const OptTensor&, const OptTensor&,
                    const Tensor&, const Tensor&, const OptTensor&, const Tensor&, const Tensor&,
                    std::optional<double>, std::optional<double>, bool, const OptTensor&,
                    int64_t) {}

void nothing() {}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(kdaguard_probe, CPU, m) {
  m.impl("decode", KDAGUARD_BOX(&decode_nothing));
}

STABLE_TORCH_LIBRARY_IMPL(kdaguard_probe, CUDA, m) {
  m.impl("decode", KDAGUARD_BOX(&decode_nothing));
}

STABLE_TORCH_LIBRARY_IMPL(kdaguard_probe, CompositeExplicitAutograd, m) {
  m.impl("nothing", KDAGUARD_BOX(&nothing));
}
