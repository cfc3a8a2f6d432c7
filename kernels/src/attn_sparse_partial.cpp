/* Sparse attention of one request (cube core): the partial state (o, m, l
 * in base 2, see wsp_attn.hpp) of G query rows of one KV group over the
 * selected tokens only, taken in the order given.
 *
 * Tensors: 0 = q (in, f32, G x D, G <= 16, D <= 128), 1 = kv (in, f32, the
 * pool region of one KV head, pages * 2P rows x D, at most 2^20 rows),
 * 2 = meta (in, i32, 2 x W, W <= 65536: row 0 the request's page table,
 * row 1 the selected token positions), 3 = part (out, f32, G x (D + 2)).
 * Scalars: 0 = n selected tokens, 1 <= n <= W (meta[1][0 .. n)),
 * 1 = page size P >= 1 with kv rows a multiple of 2P, 2 = scale (f32 bits in
 * the low 32 bits, high bits zero, finite), 3 = context length Lc >= 1 with
 * the page table covering it: (Lc - 1) / P < W.
 * Run time: a selected position < 0 or >= Lc, or the page of a selected
 * token outside the pool (< 0 or >= kv rows / 2P), rejects the call before
 * anything is written. A position may be selected more than once (it then
 * counts more than once).
 *
 * Cost: the index checks, one per selected token, plus the core's
 * (wsp_attn.hpp) over the n selected tokens:
 *   n + 4GD + 4G + n (2D + 2GD + 6G) + ceil(n / 32) (GD + 6G). */
#include "wsp_attn.hpp"

using namespace wsp;
using namespace wsp::attn;

extern "C" uint64_t wsp_kernel_attn_sparse_partial(const WspKernelArgs *args) {
    if (args->num_tensors != 4 || args->num_scalars != 4) return WSP_KERNEL_REJECTED;
    const WspTensorView &vq = args->tensors[0];
    const WspTensorView &vkv = args->tensors[1];
    const WspTensorView &vm = args->tensors[2];
    const WspTensorView &vp = args->tensors[3];
    if (!is_f32_tile(vq, kMaxGroup, kMaxDim) || !is_f32_tile(vkv, kMaxPoolRows, kMaxDim) ||
        !is_i32_tile(vm, 2, kMaxTable) || vm.rows != 2 ||
        !is_f32_tile(vp, kMaxGroup, kMaxDim + 2) || vkv.cols != vq.cols ||
        vp.rows != vq.rows || vp.cols != vq.cols + 2)
        return WSP_KERNEL_REJECTED;
    const uint64_t n = args->scalars[0];
    const uint64_t lc = args->scalars[3];
    int page;
    float scale;
    if (n < 1 || n > vm.cols || !page_from_scalar(args->scalars[1], vkv.rows, &page) ||
        !scale_from_scalar(args->scalars[2], &scale) || lc < 1 ||
        (lc - 1) / static_cast<uint64_t>(page) >= vm.cols)
        return WSP_KERNEL_REJECTED;

    const View<int32_t> meta = view_of<int32_t>(vm);
    const int32_t *table = meta.base;
    const int32_t *selected = meta.base + meta.stride;
    const int pages = static_cast<int>(vkv.rows) / (2 * page);
    const int count = static_cast<int>(n);
    /* lc <= W * P <= 2^35 and positions are i32: compare in int64_t. */
    const int64_t context = static_cast<int64_t>(lc);
    for (int i = 0; i < count; ++i) {
        const int64_t t = selected[i];
        if (t < 0 || t >= context || key_row(table, page, pages, t) < 0)
            return WSP_KERNEL_REJECTED;
    }

    auto row_of = [=](int64_t i) { return key_row(table, page, pages, selected[i]); };
    Cycles cost = static_cast<Cycles>(count);
    cost += partial(view_of<float>(vq), view_of<float>(vkv), row_of, count, page, scale,
                    view_of<float>(vp));
    return cost;
}
