/* Y = X / sqrt(mean(X^2) + eps) * G per row (vector core).
 * Tensors: 0 = X (in, at most 16 x 1024), 1 = G (in, 1 x cols of X),
 * 2 = Y (out, shape of X). Scalar 0 = eps: f32 bits in the low 32 bits (the
 * high 32 bits zero), finite and >= 0.
 *
 * Rows are independent, so X is processed in blocks of kBlockRows rows to
 * keep the kernel's stack small (~36 KiB); the cost is the same as one
 * whole-tile pass: load G (cols) + 6 x rows x cols (load, square, row sum,
 * divide by rms, scale by G, store) + 3 x rows (mean, + eps, sqrt). */
#include "wsp_tile.hpp"

using namespace wsp;

namespace {
constexpr int kMaxRows = 16;
constexpr int kMaxCols = 1024;
constexpr int kBlockRows = 4;
using Block = Tile<float, kBlockRows, kMaxCols>;
using Column = Tile<float, kBlockRows, 1>;
using Gamma = Tile<float, 1, kMaxCols>;

/* eps is valid when its high bits are zero and it is finite and >= 0
 * (a NaN fails the comparison). */
bool eps_from_scalar(uint64_t raw, float *eps) {
    if ((raw >> 32) != 0) return false;
    const float e = __builtin_bit_cast(float, static_cast<uint32_t>(raw));
    if (!(e >= 0.0f && e <= 3.40282346638528859812e+38f)) return false;
    *eps = e;
    return true;
}
}  // namespace

extern "C" uint64_t wsp_kernel_rmsnorm(const WspKernelArgs *args) {
    if (args->num_tensors != 3 || args->num_scalars != 1) return WSP_KERNEL_REJECTED;
    const WspTensorView &vx = args->tensors[0];
    const WspTensorView &vg = args->tensors[1];
    const WspTensorView &vy = args->tensors[2];
    if (!is_f32_tile(vx, kMaxRows, kMaxCols) || !is_f32_tile(vg, 1, kMaxCols) ||
        !is_f32_tile(vy, kMaxRows, kMaxCols) || vg.cols != vx.cols || !same_shape(vx, vy))
        return WSP_KERNEL_REJECTED;
    float eps;
    if (!eps_from_scalar(args->scalars[0], &eps)) return WSP_KERNEL_REJECTED;

    const View<float> x = view_of<float>(vx);
    const View<float> y = view_of<float>(vy);
    const float n = static_cast<float>(x.cols);
    Gamma g;
    Block xt, yt;
    Column rms;
    Cycles cost = TLOAD(g, view_of<float>(vg));
    for (int first = 0; first < x.rows; first += kBlockRows) {
        const int count = x.rows - first < kBlockRows ? x.rows - first : kBlockRows;
        cost += TLOAD(xt, x.row_block(first, count));
        cost += TMUL(yt, xt, xt);
        cost += TROWSUM(rms, yt);
        cost += TDIVS(rms, rms, n);
        cost += TADDS(rms, rms, eps);
        cost += TSQRT(rms, rms);
        cost += TROWEXPANDDIV(yt, xt, rms);
        cost += TCOLEXPANDMUL(yt, yt, g);
        cost += TSTORE(y.row_block(first, count), yt);
    }
    return cost;
}
