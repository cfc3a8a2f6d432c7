/* Merges n partial states of the same G query rows (vector core), by the
 * log-sum-exp rule in base 2 (see wsp_attn.hpp for the state's layout):
 *   m = max_c m_c;  w_c = l_c * 2^(m_c - m);  l = sum_c w_c;
 *   o = (sum_c o_c * w_c) / l,
 * both sums over c = 0, 1, .., n - 1 in that order. A merged state is a
 * state again, so merges compose into trees.
 *
 * Tensors: 0 = parts (in, f32, n*G x (D + 2), state c in rows c*G ..
 * (c+1)*G, D <= 128, G <= 16, n*G <= 4096), 1 = out (out, f32, G x (D + 2):
 * the merged state, or G x D: its o only). Scalar 0 = n >= 1 with
 * parts rows = n * out rows.
 *
 * Cost: pass 1 (max of m: load m_c, max)                  2 n G
 *       clear m, acc and l                                 G D + 2 G
 *       per state: load o_c, m_c, l_c; subtract, exp2,
 *       multiply, add to l; scale o_c, add to acc          n (3 G D + 6 G)
 *       divide by l, store o (and m, l for a state)        2 G D (+ 2 G)
 * total = 3GD + 2G + n (3GD + 8G) (+ 2G when out is a state).
 * Stack: two 16 x 128 tiles, about 17 KiB. */
#include "wsp_tile.hpp"

using namespace wsp;

namespace {
constexpr int kMaxGroup = 16;
constexpr int kMaxDim = 128;
constexpr uint32_t kMaxPartRows = 4096;
using OTile = Tile<float, kMaxGroup, kMaxDim>;
using Column = Tile<float, kMaxGroup, 1>;
}  // namespace

extern "C" uint64_t wsp_kernel_attn_merge(const WspKernelArgs *args) {
    if (args->num_tensors != 2 || args->num_scalars != 1) return WSP_KERNEL_REJECTED;
    const WspTensorView &vparts = args->tensors[0];
    const WspTensorView &vout = args->tensors[1];
    if (!is_f32_tile(vparts, kMaxPartRows, kMaxDim + 2) ||
        !is_f32_tile(vout, kMaxGroup, kMaxDim + 2) || vparts.cols < 3 ||
        (vout.cols != vparts.cols && vout.cols != vparts.cols - 2))
        return WSP_KERNEL_REJECTED;
    const uint64_t n = args->scalars[0];
    if (n < 1 || n > vparts.rows || n * vout.rows != vparts.rows) return WSP_KERNEL_REJECTED;

    const View<float> parts = view_of<float>(vparts);
    const View<float> out = view_of<float>(vout);
    const int g = out.rows, d = parts.cols - 2, states = static_cast<int>(n);
    const bool state_out = out.cols == parts.cols;
    auto block = [&](int c, int col, int cols) {
        return View<float>{parts.base + static_cast<intptr_t>(c) * g * parts.stride + col, g,
                           cols, parts.stride};
    };
    OTile ot, acc;
    Column m, mc, lc, w, l;
    Cycles cost = 0;
    cost += TEXPANDS(m, g, 1, -__builtin_inff());
    for (int c = 0; c < states; ++c) {
        cost += TLOAD(mc, block(c, d, 1));
        cost += TMAX(m, m, mc);
    }
    cost += TEXPANDS(acc, g, d, 0.0f);
    cost += TEXPANDS(l, g, 1, 0.0f);
    for (int c = 0; c < states; ++c) {
        cost += TLOAD(ot, block(c, 0, d));
        cost += TLOAD(mc, block(c, d, 1));
        cost += TLOAD(lc, block(c, d + 1, 1));
        cost += TSUB(w, mc, m);
        cost += TEXP2(w, w);
        cost += TMUL(w, lc, w);
        cost += TADD(l, l, w);
        cost += TROWEXPANDMUL(ot, ot, w);
        cost += TADD(acc, acc, ot);
    }
    cost += TROWEXPANDDIV(acc, acc, l);
    cost += TSTORE(View<float>{out.base, g, d, out.stride}, acc);
    if (state_out) {
        cost += TSTORE(View<float>{out.base + d, g, 1, out.stride}, m);
        cost += TSTORE(View<float>{out.base + d + 1, g, 1, out.stride}, l);
    }
    return cost;
}
