/* C = A + B on one f32 tile of at most 64 x 64 (vector core).
 * Tensors: 0 = A (in), 1 = B (in), 2 = C (out); no scalars. All three have
 * the same shape. Cost: load A + load B + add + store C = 4 x rows x cols. */
#include "wsp_tile.hpp"

using namespace wsp;

namespace {
constexpr int kMax = 64;
using AddTile = Tile<float, kMax, kMax>;
}  // namespace

extern "C" uint64_t wsp_kernel_add(const WspKernelArgs *args) {
    if (args->num_tensors != 3 || args->num_scalars != 0) return WSP_KERNEL_REJECTED;
    const WspTensorView &va = args->tensors[0];
    const WspTensorView &vb = args->tensors[1];
    const WspTensorView &vc = args->tensors[2];
    if (!is_f32_tile(va, kMax, kMax) || !is_f32_tile(vb, kMax, kMax) ||
        !is_f32_tile(vc, kMax, kMax) || !same_shape(va, vb) || !same_shape(va, vc))
        return WSP_KERNEL_REJECTED;

    AddTile a, b;
    Cycles cost = 0;
    cost += TLOAD(a, view_of<float>(va));
    cost += TLOAD(b, view_of<float>(vb));
    cost += TADD(a, a, b);
    cost += TSTORE(view_of<float>(vc), a);
    return cost;
}
