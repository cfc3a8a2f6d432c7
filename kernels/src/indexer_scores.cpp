/* Lightning-indexer scores of one query token (cube core):
 *   I[s] = sum_j w[j] * ReLU(q[j] . k[s])
 * over the H indexer heads j, for the S keys s.
 *
 * Tensors: 0 = q (in, f32, H x Dq, H <= 64, Dq <= 128), 1 = w (in, f32,
 * 1 x H), 2 = k (in, f32, S x Dq, S <= 1024), 3 = scores (out, f32, 1 x S).
 * No scalars.
 *
 * Keys go in blocks of kBlock: L = Q x K^T (each dot product summed in
 * increasing d), R = ReLU(L) (a NaN stays NaN), I = w x R (summed in
 * increasing j from 0). Fixed orders, so results are bit-identical on every
 * host.
 *
 * Cost: load q and w                               H Dq + H
 *       per key: gather its row (Dq), clear L (H), Q x K^T (H Dq x 1),
 *       ReLU (H), clear I (1), w x R (1 x H x 1), store (1)
 * total = H Dq + H + S (Dq + H Dq + 3 H + 2).
 * Stack: Q (32 KiB), a block of K^T (16 KiB) and of L (8 KiB), about
 * 57 KiB. */
#include "wsp_tile.hpp"

using namespace wsp;

namespace {
constexpr int kMaxHeads = 64;
constexpr int kMaxDim = 128;
constexpr int kMaxKeys = 1024;
constexpr int kBlock = 32;
using QTile = Tile<float, kMaxHeads, kMaxDim>;
using KtTile = Tile<float, kMaxDim, kBlock>;
using LTile = Tile<float, kMaxHeads, kBlock>;
using WTile = Tile<float, 1, kMaxHeads>;
using ITile = Tile<float, 1, kBlock>;
}  // namespace

extern "C" uint64_t wsp_kernel_indexer_scores(const WspKernelArgs *args) {
    if (args->num_tensors != 4 || args->num_scalars != 0) return WSP_KERNEL_REJECTED;
    const WspTensorView &vq = args->tensors[0];
    const WspTensorView &vw = args->tensors[1];
    const WspTensorView &vk = args->tensors[2];
    const WspTensorView &vs = args->tensors[3];
    if (!is_f32_tile(vq, kMaxHeads, kMaxDim) || !is_f32_tile(vw, 1, kMaxHeads) ||
        !is_f32_tile(vk, kMaxKeys, kMaxDim) || !is_f32_tile(vs, 1, kMaxKeys) ||
        vw.cols != vq.rows || vk.cols != vq.cols || vs.cols != vk.rows)
        return WSP_KERNEL_REJECTED;

    const View<float> k = view_of<float>(vk);
    const View<float> scores = view_of<float>(vs);
    const int h = static_cast<int>(vq.rows), d = k.cols;
    QTile q;
    WTile w;
    KtTile kt;
    LTile l;
    ITile out;
    Cycles cost = 0;
    cost += TLOAD(q, view_of<float>(vq));
    cost += TLOAD(w, view_of<float>(vw));
    for (int first = 0; first < k.rows; first += kBlock) {
        const int b = k.rows - first < kBlock ? k.rows - first : kBlock;
        kt.valid_rows = d;
        kt.valid_cols = b;
        for (int j = 0; j < b; ++j) {
            const float *row = k.base + static_cast<intptr_t>(first + j) * k.stride;
            for (int e = 0; e < d; ++e) kt.at(e, j) = row[e];
        }
        cost += cells(b, d);
        cost += TEXPANDS(l, h, b, 0.0f);
        cost += TMATMUL(l, q, kt);
        cost += TRELU(l, l);
        cost += TEXPANDS(out, 1, b, 0.0f);
        cost += TMATMUL(out, w, l);
        cost += TSTORE(View<float>{scores.base + first, 1, b, scores.stride}, out);
    }
    return cost;
}
