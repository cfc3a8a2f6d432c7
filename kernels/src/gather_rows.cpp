/* Weighted row gather (vector core): OUT[r, :] = sum over s of
 * W[r, s] * SRC[IDX[r, s], :], skipping IDX = -1 (a row whose indices are
 * all -1 is zero). With one column of weights 1 it gathers rows (an MoE
 * expert's tokens into a tile); with a token's routing weights and the rows
 * its pairs went to, it combines the experts' outputs back in token order.
 *
 * Tensors: 0 = IDX (in, i32, R x S, R <= 64, S <= 64), 1 = W (in, f32,
 * R x S), 2 = SRC (in, f32, N x C, N <= 65536, C <= 1024), 3 = OUT (out, f32,
 * R x C). No scalars.
 *
 * Order of operations, all in f32: acc = 0; for s in increasing order with
 * IDX[r, s] != -1: acc = acc + W[r, s] * SRC[IDX[r, s], :] (the product
 * rounded, then the sum). So a weight 1 copies exactly (but -0 becomes +0),
 * and |OUT - exact| <= gamma_(S+1) sum_s |W SRC| to first order.
 *
 * Data check, before any output is written: every index is -1 or in
 * 0 .. N; otherwise WSP_KERNEL_REJECTED.
 *
 * Cost, independent of the data (skipped slots charged too): load IDX and W
 * (2 R S), zero the accumulator (R C), per slot load, scale and add
 * (3 R S C), store (R C) = 2 R S + 2 R C + 3 R S C. */
#include "wsp_tile.hpp"

using namespace wsp;

namespace {
constexpr int kMaxCols = 1024;
using Row = Tile<float, 1, kMaxCols>;
}  // namespace

extern "C" uint64_t wsp_kernel_gather_rows(const WspKernelArgs *args) {
    if (args->num_tensors != 4 || args->num_scalars != 0) return WSP_KERNEL_REJECTED;
    const WspTensorView &vi = args->tensors[0];
    const WspTensorView &vw = args->tensors[1];
    const WspTensorView &vs = args->tensors[2];
    const WspTensorView &vo = args->tensors[3];
    if (!is_i32_tile(vi, 64, 64) || !is_f32_tile(vw, 64, 64) ||
        !is_f32_tile(vs, 1u << 16, kMaxCols) || !is_f32_tile(vo, 64, kMaxCols) ||
        !same_shape(vi, vw) || vo.rows != vi.rows || vo.cols != vs.cols)
        return WSP_KERNEL_REJECTED;

    const int rows = static_cast<int>(vi.rows);
    const int slots = static_cast<int>(vi.cols);
    const int cols = static_cast<int>(vs.cols);
    const View<int32_t> idx = view_of<int32_t>(vi);
    const View<float> w = view_of<float>(vw);
    const View<float> src = view_of<float>(vs);
    const View<float> out = view_of<float>(vo);
    for (int r = 0; r < rows; ++r)
        for (int s = 0; s < slots; ++s) {
            const int32_t i = idx.base[static_cast<intptr_t>(r) * idx.stride + s];
            if (i != -1 && (i < 0 || i >= src.rows)) return WSP_KERNEL_REJECTED;
        }

    Row acc, term;
    for (int r = 0; r < rows; ++r) {
        TEXPANDS(acc, 1, cols, 0.0f);
        for (int s = 0; s < slots; ++s) {
            const int32_t i = idx.base[static_cast<intptr_t>(r) * idx.stride + s];
            if (i == -1) continue;
            TLOAD(term, src.row_block(i, 1));
            TMULS(term, term, w.base[static_cast<intptr_t>(r) * w.stride + s]);
            TADD(acc, acc, term);
        }
        TSTORE(out.row_block(r, 1), acc);
    }
    return 2 * cells(rows, slots) + 2 * cells(rows, cols) +
           3 * cells(rows, slots) * static_cast<Cycles>(cols);
}
