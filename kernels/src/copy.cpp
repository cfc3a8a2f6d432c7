/* Y = X element by element in row-major order (vector core): a move
 * between layouts, e.g. the o of a request's attention states ([heads x D]
 * rows of a [heads x (D+2)] state tensor) into one row of the output
 * projection's input ([1 x heads*D]).
 *
 * Tensors: 0 = X (in), 1 = Y (out); each at most 64 rows and 4,096 cols,
 * both holding the same number of elements, at most 65,536. No scalars.
 * Cost: load + store = 2 x elements. */
#include "wsp_tile.hpp"

using namespace wsp;

namespace {
constexpr int kMaxRows = 64;
constexpr int kMaxCols = 4096;
constexpr uint32_t kMaxElements = 65536;
}  // namespace

extern "C" uint64_t wsp_kernel_copy(const WspKernelArgs *args) {
    if (args->num_tensors != 2 || args->num_scalars != 0) return WSP_KERNEL_REJECTED;
    const WspTensorView &vx = args->tensors[0];
    const WspTensorView &vy = args->tensors[1];
    if (!is_f32_tile(vx, kMaxRows, kMaxCols) || !is_f32_tile(vy, kMaxRows, kMaxCols))
        return WSP_KERNEL_REJECTED;
    const uint32_t n = vx.rows * vx.cols;
    if (n != vy.rows * vy.cols || n > kMaxElements) return WSP_KERNEL_REJECTED;

    const View<float> x = view_of<float>(vx);
    const View<float> y = view_of<float>(vy);
    /* Walk both views in row-major order: no tile holds all of X. */
    int xr = 0, xc = 0, yr = 0, yc = 0;
    for (uint32_t e = 0; e < n; ++e) {
        y.base[static_cast<intptr_t>(yr) * y.stride + yc] =
            x.base[static_cast<intptr_t>(xr) * x.stride + xc];
        if (++xc == x.cols) xc = 0, ++xr;
        if (++yc == y.cols) yc = 0, ++yr;
    }
    return 2 * static_cast<Cycles>(n);
}
