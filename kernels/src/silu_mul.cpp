/* OUT = SiLU(G) * U elementwise on one f32 tile of at most 64 x 64 (vector
 * core), SiLU(g) = g / (1 + e^-g): the gated activation of a SwiGLU MLP,
 * G the gate projection, U the up projection.
 *
 * Tensors: 0 = G (in), 1 = U (in), 2 = OUT (out); all three the same shape.
 * No scalars.
 *
 * Order of operations, all in f32, one rounding each:
 *   T = -G (exact); T = e^T (exp_f32, a few ulp); T = T + 1;
 *   S = G / T; OUT = S * U.
 * So |OUT - exact| <= (e + 3) u |SiLU(G) U| to first order, e the exp's
 * error in ulp (< 8) and u = 2^-24. A G below -88.7 gives e^-G = inf and
 * SiLU = -0; a NaN stays NaN.
 *
 * Cost: load G + load U + 5 elementwise ops + store OUT = 8 x rows x cols. */
#include "wsp_tile.hpp"

using namespace wsp;

namespace {
constexpr int kMax = 64;
using SiluTile = Tile<float, kMax, kMax>;
}  // namespace

extern "C" uint64_t wsp_kernel_silu_mul(const WspKernelArgs *args) {
    if (args->num_tensors != 3 || args->num_scalars != 0) return WSP_KERNEL_REJECTED;
    const WspTensorView &vg = args->tensors[0];
    const WspTensorView &vu = args->tensors[1];
    const WspTensorView &vo = args->tensors[2];
    if (!is_f32_tile(vg, kMax, kMax) || !is_f32_tile(vu, kMax, kMax) ||
        !is_f32_tile(vo, kMax, kMax) || !same_shape(vg, vu) || !same_shape(vg, vo))
        return WSP_KERNEL_REJECTED;

    SiluTile g, u, t;
    Cycles cost = 0;
    cost += TLOAD(g, view_of<float>(vg));
    cost += TLOAD(u, view_of<float>(vu));
    cost += TMULS(t, g, -1.0f);
    cost += TEXP(t, t);
    cost += TADDS(t, t, 1.0f);
    cost += map2(t, g, t, [](float x, float d) { return x / d; });
    cost += TMUL(t, t, u);
    cost += TSTORE(view_of<float>(vo), t);
    return cost;
}
