/*
 * wsp_attn.hpp: the online-softmax core shared by the attention kernels
 * (attn_decode_partial, attn_sparse_partial) and the paged KV pool layout.
 *
 * One log base everywhere: base 2. A partial state of G query rows over a
 * list of tokens is G rows of D + 2 f32 columns: o[0..D] (normalised), m,
 * l. With c = fl(scale * log2(e)) and s2_i = fl(fl(q . k_i) * c), m is the
 * max of s2_i and l = sum_i 2^(s2_i - m), so m + log2(l) is the log-sum-exp.
 *
 * The tokens are taken in the order given, in blocks of kBlock: per block
 * the scores S = Q x K^T (each dot product summed in increasing d), the new
 * max m' = max(m, rowmax S), alpha = 2^(m - m'), P = 2^(S - m'),
 * l = l * alpha + rowsum P (left to right), acc = acc * alpha + P x V (in
 * increasing token order); at the end o = acc / l. Every sum runs in a
 * fixed order, so results are bit-identical on every host.
 *
 * Cost (G rows, D columns, n tokens in nb = ceil(n / kBlock) blocks):
 *   load Q, clear acc, m and l, divide by l, store o, m, l  4 G D + 4 G
 *   per token: gather its key and value rows                 2 D
 *              S = Q x K^T (G x D x 1), P x V (G x 1 x D)    2 G D
 *              clear S, scale, row max, subtract, exp2,
 *              row sum                                       6 G
 *   per block: max, subtract, exp2, copy of m; l update      6 G
 *              acc rescale                                   G D
 * total = 4GD + 4G + n (2D + 2GD + 6G) + nb (GD + 6G).
 */
#ifndef WSP_ATTN_HPP
#define WSP_ATTN_HPP

#include "wsp_tile.hpp"

namespace wsp {
namespace attn {

/* Query rows of one KV group and head dimension: the tiles' capacity. */
constexpr int kMaxGroup = 16;
constexpr int kMaxDim = 128;
/* Tokens per block: K^T and V of a block take 2 x 16 KiB of stack; with Q,
 * acc and S the core takes about 52 KiB (measured with -fstack-usage). */
constexpr int kBlock = 32;
/* Rows of a pool region (1 Mi rows = 512 Ki tokens of one KV head). */
constexpr uint32_t kMaxPoolRows = 1u << 20;
/* Entries of a page table (and selected positions of the sparse kernel). */
constexpr uint32_t kMaxTable = 65536;

using QTile = Tile<float, kMaxGroup, kMaxDim>;
using KtTile = Tile<float, kMaxDim, kBlock>;
using VTile = Tile<float, kBlock, kMaxDim>;
using STile = Tile<float, kMaxGroup, kBlock>;
using Column = Tile<float, kMaxGroup, 1>;

/* The scale scalar: f32 bits in the low 32 bits, high bits zero, finite. */
inline bool scale_from_scalar(uint64_t raw, float *scale) {
    if ((raw >> 32) != 0) return false;
    const float s = __builtin_bit_cast(float, static_cast<uint32_t>(raw));
    if (!(s - s == 0.0f)) return false; /* NaN and +-inf give NaN */
    *scale = s;
    return true;
}

/* The page size scalar of a pool of `pool_rows` rows: P >= 1 and pool_rows
 * a multiple of 2P. */
inline bool page_from_scalar(uint64_t raw, uint32_t pool_rows, int *page) {
    if (raw < 1 || raw > pool_rows / 2 || pool_rows % (2 * raw) != 0) return false;
    *page = static_cast<int>(raw);
    return true;
}

/* The pool row of token `t`'s key through `table` (entries of a request's
 * page table), or -1 when the page is outside a pool of `pages` pages. */
inline int key_row(const int32_t *table, int page, int pages, int64_t t) {
    const int32_t p = table[t / page];
    if (p < 0 || p >= pages) return -1;
    return p * 2 * page + static_cast<int>(t % page);
}

/* The partial state of `n` >= 1 tokens whose key rows in `kv` are
 * row_of(0) .. row_of(n - 1) (each value P rows below its key), for the
 * queries `q`, into `part`. Shapes and rows have been checked: q is G x D,
 * part G x (D + 2), kv has D cols and every row_of(i) is a key row in it. */
template <typename RowOf>
Cycles partial(const View<float> &q, const View<float> &kv, RowOf row_of, int64_t n, int page,
               float scale, const View<float> &part) {
    const int g = q.rows, d = q.cols;
    const float c = scale * 1.44269502162933349609375f;
    QTile qt, acc;
    KtTile kt;
    VTile vt;
    STile s;
    Column m, l, mb, alpha, ls;
    Cycles cost = 0;
    cost += TLOAD(qt, q);
    cost += TEXPANDS(acc, g, d, 0.0f);
    cost += TEXPANDS(m, g, 1, -__builtin_inff());
    cost += TEXPANDS(l, g, 1, 0.0f);
    for (int64_t first = 0; first < n; first += kBlock) {
        const int b = n - first < kBlock ? static_cast<int>(n - first) : kBlock;
        kt.valid_rows = d;
        kt.valid_cols = b;
        vt.valid_rows = b;
        vt.valid_cols = d;
        for (int j = 0; j < b; ++j) {
            const float *kr = kv.base + static_cast<intptr_t>(row_of(first + j)) * kv.stride;
            const float *vr = kr + static_cast<intptr_t>(page) * kv.stride;
            for (int e = 0; e < d; ++e) {
                kt.at(e, j) = kr[e];
                vt.at(j, e) = vr[e];
            }
        }
        cost += 2 * cells(b, d);
        cost += TEXPANDS(s, g, b, 0.0f);
        cost += TMATMUL(s, qt, kt);
        cost += TMULS(s, s, c);
        cost += TROWMAX(mb, s);
        cost += TMAX(mb, mb, m);
        cost += TSUB(alpha, m, mb);
        cost += TEXP2(alpha, alpha);
        cost += map1(m, mb, [](float x) { return x; });
        cost += TROWEXPANDSUB(s, s, m);
        cost += TEXP2(s, s);
        cost += TROWSUM(ls, s);
        cost += TMUL(l, l, alpha);
        cost += TADD(l, l, ls);
        cost += TROWEXPANDMUL(acc, acc, alpha);
        cost += TMATMUL(acc, s, vt);
    }
    cost += TROWEXPANDDIV(acc, acc, l);
    cost += TSTORE(View<float>{part.base, g, d, part.stride}, acc);
    cost += TSTORE(View<float>{part.base + d, g, 1, part.stride}, m);
    cost += TSTORE(View<float>{part.base + d + 1, g, 1, part.stride}, l);
    return cost;
}

}  // namespace attn
}  // namespace wsp

#endif /* WSP_ATTN_HPP */
