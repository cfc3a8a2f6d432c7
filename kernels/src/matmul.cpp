/* C = A x B on f32 tiles (cube core): A is M x K, B is K x N, C is M x N,
 * each at most 64 x 64; C is written, never read. Tensors: 0 = A (in),
 * 1 = B (in), 2 = C (out); no scalars. Cost: load A (M K) + load B (K N) +
 * matmul (M K N) + store C (M N); one 16 x 16 x 16 product costs
 * 256 + 256 + 4096 + 256 = 4864. */
#include "wsp_tile.hpp"

using namespace wsp;

namespace {
constexpr int kMax = 64;
using MatmulTile = Tile<float, kMax, kMax>;
}  // namespace

extern "C" uint64_t wsp_kernel_matmul(const WspKernelArgs *args) {
    if (args->num_tensors != 3 || args->num_scalars != 0) return WSP_KERNEL_REJECTED;
    const WspTensorView &va = args->tensors[0];
    const WspTensorView &vb = args->tensors[1];
    const WspTensorView &vc = args->tensors[2];
    if (!is_f32_tile(va, kMax, kMax) || !is_f32_tile(vb, kMax, kMax) ||
        !is_f32_tile(vc, kMax, kMax))
        return WSP_KERNEL_REJECTED;
    if (vb.rows != va.cols || vc.rows != va.rows || vc.cols != vb.cols)
        return WSP_KERNEL_REJECTED;

    MatmulTile a, b, c;
    Cycles cost = 0;
    cost += TLOAD(a, view_of<float>(va));
    cost += TLOAD(b, view_of<float>(vb));
    /* The accumulator starts at zero in the core's own buffer: no load of C
     * and, as on the device, no cycles for the clear. */
    c.valid_rows = va.rows;
    c.valid_cols = vb.cols;
    for (int r = 0; r < c.valid_rows; ++r)
        for (int j = 0; j < c.valid_cols; ++j) c.at(r, j) = 0.0f;
    cost += TMATMUL(c, a, b);
    cost += TSTORE(view_of<float>(vc), c);
    return cost;
}
