/* C = A * A, elementwise on one f32 tile of at most 64 x 64 (vector core).
 * Tensors: 0 = A (in), 1 = C (out), the same shape; no scalars. Cost: load
 * A + multiply + store C = 3 x rows x cols. */
#include "wsp_tile.hpp"

using namespace wsp;

namespace {
constexpr int kMax = 64;
using SquareTile = Tile<float, kMax, kMax>;
}  // namespace

extern "C" uint64_t wsp_kernel_square(const WspKernelArgs *args) {
    if (args->num_tensors != 2 || args->num_scalars != 0) return WSP_KERNEL_REJECTED;
    const WspTensorView &va = args->tensors[0];
    const WspTensorView &vc = args->tensors[1];
    if (!is_f32_tile(va, kMax, kMax) || !is_f32_tile(vc, kMax, kMax) || !same_shape(va, vc))
        return WSP_KERNEL_REJECTED;

    SquareTile a;
    Cycles cost = 0;
    cost += TLOAD(a, view_of<float>(va));
    cost += TMUL(a, a, a);
    cost += TSTORE(view_of<float>(vc), a);
    return cost;
}
