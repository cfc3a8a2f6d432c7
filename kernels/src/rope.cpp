/* Rotary position embedding of one token's heads (vector core), with the
 * half-split pairing (GPT-NeoX, Llama in Hugging Face's layout): element i
 * of a head of D is rotated with element i + D/2 by the angle of frequency i.
 *
 * Tensors: 0 = X (in): n heads of D elements, as one row [1 x n*D] or as
 * [n x D]; 1 = CS (in) [1 x D]: the position's cos(pos * f_i) in columns
 * 0 .. D/2 and sin(pos * f_i) in D/2 .. D (a row of the model's cos/sin
 * cache); 2 = Y (out) [n x D]. D even, at most 128; n at most 64; X and Y
 * hold the same number of elements. No scalars. For each head h and i < D/2,
 * with c = CS[i], s = CS[D/2 + i], a = X_h[i], b = X_h[i + D/2]:
 *   Y[h, i] = a c - b s,    Y[h, i + D/2] = b c + a s.
 *
 * Cost: load CS (D) + per head: load (D), 6 elementwise ops on halves (3D),
 * store (D): n x 5D + D. */
#include "wsp_tile.hpp"

using namespace wsp;

namespace {
constexpr int kMaxHeads = 64;
constexpr int kMaxDim = 128;
constexpr int kHalf = kMaxDim / 2;
using Half = Tile<float, 1, kHalf>;

/* Elements of head h, half `second` (0 or 1), of a view of n heads that is
 * either one row of n*D or n rows of D. */
View<float> half_of(const View<float> &v, int h, int d, int second) {
    float *head = v.rows == 1 ? v.base + static_cast<intptr_t>(h) * d
                              : v.base + static_cast<intptr_t>(h) * v.stride;
    return View<float>{head + second * (d / 2), 1, d / 2, d / 2};
}
}  // namespace

extern "C" uint64_t wsp_kernel_rope(const WspKernelArgs *args) {
    if (args->num_tensors != 3 || args->num_scalars != 0) return WSP_KERNEL_REJECTED;
    const WspTensorView &vx = args->tensors[0];
    const WspTensorView &vcs = args->tensors[1];
    const WspTensorView &vy = args->tensors[2];
    if (!is_f32_tile(vy, kMaxHeads, kMaxDim) || !is_f32_tile(vcs, 1, kMaxDim) ||
        !is_f32_tile(vx, kMaxHeads, kMaxHeads * kMaxDim))
        return WSP_KERNEL_REJECTED;
    const int d = static_cast<int>(vy.cols);
    const int n = static_cast<int>(vy.rows);
    if (d % 2 != 0 || vcs.cols != vy.cols) return WSP_KERNEL_REJECTED;
    /* X is [n x D] or [1 x n*D]. */
    const bool as_rows = same_shape(vx, vy);
    const bool as_row = vx.rows == 1 && vx.cols == vy.rows * vy.cols;
    if (!as_rows && !as_row) return WSP_KERNEL_REJECTED;

    const View<float> x = view_of<float>(vx);
    const View<float> y = view_of<float>(vy);
    const View<float> cs = view_of<float>(vcs);
    Half c, s, a, b, t, u, lo, hi;
    Cycles cost = TLOAD(c, View<float>{cs.base, 1, d / 2, d / 2});
    cost += TLOAD(s, View<float>{cs.base + d / 2, 1, d / 2, d / 2});
    for (int h = 0; h < n; ++h) {
        cost += TLOAD(a, half_of(x, h, d, 0));
        cost += TLOAD(b, half_of(x, h, d, 1));
        cost += TMUL(t, a, c);
        cost += TMUL(u, b, s);
        cost += TSUB(lo, t, u);
        cost += TMUL(t, b, c);
        cost += TMUL(u, a, s);
        cost += TADD(hi, t, u);
        cost += TSTORE(half_of(y, h, d, 0), lo);
        cost += TSTORE(half_of(y, h, d, 1), hi);
    }
    return cost;
}
