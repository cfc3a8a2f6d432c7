/* Mixture-of-Experts alignment (vector core), as vLLM's
 * moe_align_block_size: the routed (token, slot) pairs sorted by expert, each
 * expert's run padded up to a multiple of the tile height M, so that every
 * expert's tokens fill whole tiles of M rows (an expert with no tokens gets
 * no tile).
 *
 * Tensors: 0 = ids (in, i32, T x k: the expert of each (token, slot) pair,
 * or -1 for none, as moe_route writes them), 1 = tiles (out, i32,
 * 1 x (E + 1)), 2 = rows (out, i32, P x 1), 3 = slot (out, i32, T x k).
 * Scalar 0 = M, 1 <= M <= 64.
 *
 * Output, with n_e = the number of pairs routed to expert e and
 * t_e = ceil(n_e / M) its tiles:
 *   tiles[0] = 0, tiles[e + 1] = tiles[e] + t_e (in tiles);
 *   rows[tiles[e] * M + i] = the token of expert e's i-th pair, pairs in
 *   increasing (token, slot) order, for i < n_e; -1 for the padding after
 *   them and for every row from tiles[E] * M on;
 *   slot[t, s] = the row of rows where pair (t, s) went, -1 for none.
 * tiles[E] * M <= pairs + E (M - 1) rows are used.
 *
 * Data checks, all before any output is written: every id is -1 or in
 * 0 .. E, and the padded rows fit in P; otherwise WSP_KERNEL_REJECTED.
 *
 * Cost: read the ids (T k), count per expert (T k), prefix sum (E + 1),
 * write rows (P) and slot (T k) = 3 T k + E + 1 + P. */
#include "wsp_tile.hpp"

using namespace wsp;

namespace {
constexpr int kMaxExperts = 64;
}  // namespace

extern "C" uint64_t wsp_kernel_moe_align(const WspKernelArgs *args) {
    if (args->num_tensors != 4 || args->num_scalars != 1) return WSP_KERNEL_REJECTED;
    const WspTensorView &vi = args->tensors[0];
    const WspTensorView &vt = args->tensors[1];
    const WspTensorView &vr = args->tensors[2];
    const WspTensorView &vs = args->tensors[3];
    if (!is_i32_tile(vi, 4096, 64) || !is_i32_tile(vt, 1, kMaxExperts + 1) ||
        !is_i32_tile(vr, 1u << 16, 1) || !is_i32_tile(vs, 4096, 64) || !same_shape(vi, vs))
        return WSP_KERNEL_REJECTED;
    const uint64_t tile = args->scalars[0];
    if (tile < 1 || tile > 64) return WSP_KERNEL_REJECTED;

    const int tokens = static_cast<int>(vi.rows);
    const int k = static_cast<int>(vi.cols);
    const int experts = static_cast<int>(vt.cols) - 1;
    const int m = static_cast<int>(tile);
    const int capacity = static_cast<int>(vr.rows);
    const View<int32_t> ids = view_of<int32_t>(vi);

    /* Count, checking every id. */
    int count[kMaxExperts] = {};
    for (int t = 0; t < tokens; ++t)
        for (int s = 0; s < k; ++s) {
            const int32_t e = ids.base[static_cast<intptr_t>(t) * ids.stride + s];
            if (e == -1) continue;
            if (e < 0 || e >= experts) return WSP_KERNEL_REJECTED;
            ++count[e];
        }
    int start[kMaxExperts + 1];
    start[0] = 0;
    for (int e = 0; e < experts; ++e) start[e + 1] = start[e] + (count[e] + m - 1) / m;
    if (static_cast<int64_t>(start[experts]) * m > capacity) return WSP_KERNEL_REJECTED;

    int32_t *tiles = view_of<int32_t>(vt).base;
    for (int e = 0; e <= experts; ++e) tiles[e] = start[e];
    const View<int32_t> rows = view_of<int32_t>(vr);
    for (int r = 0; r < capacity; ++r) rows.base[static_cast<intptr_t>(r) * rows.stride] = -1;
    const View<int32_t> slot = view_of<int32_t>(vs);
    int next[kMaxExperts];
    for (int e = 0; e < experts; ++e) next[e] = start[e] * m;
    for (int t = 0; t < tokens; ++t)
        for (int s = 0; s < k; ++s) {
            const int32_t e = ids.base[static_cast<intptr_t>(t) * ids.stride + s];
            int32_t *out = slot.base + static_cast<intptr_t>(t) * slot.stride + s;
            if (e == -1) {
                *out = -1;
                continue;
            }
            const int r = next[e]++;
            rows.base[static_cast<intptr_t>(r) * rows.stride] = t;
            *out = r;
        }
    return 3 * cells(tokens, k) + static_cast<Cycles>(experts + 1) + static_cast<Cycles>(capacity);
}
