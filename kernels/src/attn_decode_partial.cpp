/* Decode attention over one KV chunk of one request (cube core): the partial
 * state (o, m, l in base 2, see wsp_attn.hpp) of G query rows of one KV
 * group over tokens first .. first + n of the request.
 *
 * Tensors: 0 = q (in, f32, G x D, G <= 16, D <= 128), 1 = kv (in, f32, the
 * pool region of one KV head, pages * 2P rows x D, at most 2^20 rows),
 * 2 = table (in, i32, 1 x W, W <= 65536: the request's page table),
 * 3 = part (out, f32, G x (D + 2)).
 * Scalars: 0 = first token, 1 = token count n >= 1, 2 = page size P >= 1
 * with kv rows a multiple of 2P, 3 = scale (f32 bits in the low 32 bits,
 * high bits zero, finite). The chunk must lie in the page table:
 * (first + n - 1) / P < W.
 * Run time: a page index of the chunk < 0 or >= kv rows / 2P rejects the
 * call before anything is written.
 *
 * Cost: the core's (wsp_attn.hpp) plus the page check, one per page the
 * chunk touches, pages = (first + n - 1) / P - first / P + 1:
 *   4GD + 4G + n (2D + 2GD + 6G) + ceil(n / 32) (GD + 6G) + pages. */
#include "wsp_attn.hpp"

using namespace wsp;
using namespace wsp::attn;

extern "C" uint64_t wsp_kernel_attn_decode_partial(const WspKernelArgs *args) {
    if (args->num_tensors != 4 || args->num_scalars != 4) return WSP_KERNEL_REJECTED;
    const WspTensorView &vq = args->tensors[0];
    const WspTensorView &vkv = args->tensors[1];
    const WspTensorView &vt = args->tensors[2];
    const WspTensorView &vp = args->tensors[3];
    if (!is_f32_tile(vq, kMaxGroup, kMaxDim) || !is_f32_tile(vkv, kMaxPoolRows, kMaxDim) ||
        !is_i32_tile(vt, 1, kMaxTable) || !is_f32_tile(vp, kMaxGroup, kMaxDim + 2) ||
        vkv.cols != vq.cols || vp.rows != vq.rows || vp.cols != vq.cols + 2)
        return WSP_KERNEL_REJECTED;
    const uint64_t first = args->scalars[0];
    const uint64_t n = args->scalars[1];
    int page;
    float scale;
    if (n < 1 || !page_from_scalar(args->scalars[2], vkv.rows, &page) ||
        !scale_from_scalar(args->scalars[3], &scale))
        return WSP_KERNEL_REJECTED;
    if (first > UINT64_MAX - (n - 1) || (first + n - 1) / static_cast<uint64_t>(page) >= vt.cols)
        return WSP_KERNEL_REJECTED;

    /* first + n <= W * P <= 2^16 * 2^19: token numbers fit an int64_t. */
    const int64_t start = static_cast<int64_t>(first);
    const int64_t count = static_cast<int64_t>(n);
    const int pages = static_cast<int>(vkv.rows) / (2 * page);
    const int32_t *table = view_of<int32_t>(vt).base;
    const int first_page = static_cast<int>(start / page);
    const int last_page = static_cast<int>((start + count - 1) / page);
    for (int p = first_page; p <= last_page; ++p)
        if (table[p] < 0 || table[p] >= pages) return WSP_KERNEL_REJECTED;

    auto row_of = [=](int64_t i) { return key_row(table, page, pages, start + i); };
    Cycles cost = static_cast<Cycles>(last_page - first_page + 1);
    cost += partial(view_of<float>(vq), view_of<float>(vkv), row_of, count, page, scale,
                    view_of<float>(vp));
    return cost;
}
