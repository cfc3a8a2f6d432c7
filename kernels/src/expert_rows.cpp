/* OUT[r, :] += GATE[r, 0] * (X[r, :] x W) for every row r (cube core): the
 * rows routed to one expert, W that expert's weight matrix (a region of the
 * stacked E*H x F weights), GATE each row's routing weight.
 *
 * Tensors: 0 = X (in, f32, R x H), 1 = W (in, f32, H x F), 2 = GATE (in, f32,
 * R x 1), 3 = OUT (inout, f32, R x F); R <= 16, H <= 64, F <= 64. No scalars.
 *
 * Order of operations, all in f32:
 *   Y = 0, then Y += X x W by TMATMUL (each Y[r, j] accumulates
 *       X[r, h] * W[h, j] in increasing h);
 *   Y[r, :] = Y[r, :] * GATE[r, 0] (one rounding per element);
 *   OUT = OUT + Y (one rounding per element).
 * So |OUT - exact| <= (H + 2) u (|OUT_in| + |GATE| sum_h |X W|) to first
 * order, u = 2^-24.
 *
 * Cost: load X (R H) + load W (H F) + load GATE (R) + load OUT (R F)
 * + zero Y (R F) + matmul (R H F) + scale (R F) + add (R F) + store OUT (R F)
 * = R H + H F + R + 5 R F + R H F. */
#include "wsp_tile.hpp"

using namespace wsp;

namespace {
constexpr int kMaxRows = 16;
constexpr int kMaxHidden = 64;
constexpr int kMaxFfn = 64;
using XTile = Tile<float, kMaxRows, kMaxHidden>;
using WTile = Tile<float, kMaxHidden, kMaxFfn>;
using OutTile = Tile<float, kMaxRows, kMaxFfn>;
using GateTile = Tile<float, kMaxRows, 1>;
}  // namespace

extern "C" uint64_t wsp_kernel_expert_rows(const WspKernelArgs *args) {
    if (args->num_tensors != 4 || args->num_scalars != 0) return WSP_KERNEL_REJECTED;
    const WspTensorView &vx = args->tensors[0];
    const WspTensorView &vw = args->tensors[1];
    const WspTensorView &vg = args->tensors[2];
    const WspTensorView &vo = args->tensors[3];
    if (!is_f32_tile(vx, kMaxRows, kMaxHidden) || !is_f32_tile(vw, kMaxHidden, kMaxFfn) ||
        !is_f32_tile(vg, kMaxRows, 1) || !is_f32_tile(vo, kMaxRows, kMaxFfn))
        return WSP_KERNEL_REJECTED;
    if (vw.rows != vx.cols || vg.rows != vx.rows || vo.rows != vx.rows || vo.cols != vw.cols)
        return WSP_KERNEL_REJECTED;

    XTile x;
    WTile w;
    GateTile g;
    OutTile out, y;
    Cycles cost = 0;
    cost += TLOAD(x, view_of<float>(vx));
    cost += TLOAD(w, view_of<float>(vw));
    cost += TLOAD(g, view_of<float>(vg));
    cost += TLOAD(out, view_of<float>(vo));
    cost += TEXPANDS(y, x.valid_rows, w.valid_cols, 0.0f);
    cost += TMATMUL(y, x, w);
    cost += TROWEXPANDMUL(y, y, g);
    cost += TADD(out, out, y);
    cost += TSTORE(view_of<float>(vo), out);
    return cost;
}
