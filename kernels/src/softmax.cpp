/* Y = softmax(X) per row (vector core), X and Y at most 16 x 1024, same shape.
 * Tensors: 0 = X (in), 1 = Y (out); no scalars.
 *
 * Per row: m = max, e = exp(x - m), y = e / sum(e). Rows are independent, so
 * X is processed in blocks of kBlockRows rows to keep the kernel's stack
 * small (~16 KiB); the cost equals one whole-tile pass: 7 x rows x cols (load,
 * row max, subtract, exp, row sum, divide, store). */
#include "wsp_tile.hpp"

using namespace wsp;

namespace {
constexpr int kMaxRows = 16;
constexpr int kMaxCols = 1024;
constexpr int kBlockRows = 4;
using Block = Tile<float, kBlockRows, kMaxCols>;
using Column = Tile<float, kBlockRows, 1>;
}  // namespace

extern "C" uint64_t wsp_kernel_softmax(const WspKernelArgs *args) {
    if (args->num_tensors != 2 || args->num_scalars != 0) return WSP_KERNEL_REJECTED;
    const WspTensorView &vx = args->tensors[0];
    const WspTensorView &vy = args->tensors[1];
    if (!is_f32_tile(vx, kMaxRows, kMaxCols) || !is_f32_tile(vy, kMaxRows, kMaxCols) ||
        !same_shape(vx, vy))
        return WSP_KERNEL_REJECTED;

    const View<float> x = view_of<float>(vx);
    const View<float> y = view_of<float>(vy);
    Block t;
    Column m, s;
    Cycles cost = 0;
    for (int first = 0; first < x.rows; first += kBlockRows) {
        const int count = x.rows - first < kBlockRows ? x.rows - first : kBlockRows;
        cost += TLOAD(t, x.row_block(first, count));
        cost += TROWMAX(m, t);
        cost += TROWEXPANDSUB(t, t, m);
        cost += TEXP(t, t);
        cost += TROWSUM(s, t);
        cost += TROWEXPANDDIV(t, t, s);
        cost += TSTORE(y.row_block(first, count), t);
    }
    return cost;
}
