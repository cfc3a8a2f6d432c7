/* The decode planner on the device (vector core): the KV chunk size of a
 * decode batch from the requests' lengths, for when only the device knows
 * them. It applies the host planner's rule (host-tools,
 * attention::plan::choose_chunk) in the same integer arithmetic, so that
 * both choose the same chunk for the same lengths.
 *
 * Tensors: 0 = lens (in, i32, 1 x B, B <= 4096), 1 = plan (out, i32, 1 x 1).
 * Scalars: 0 = KV heads (1 ..= 256), 1 = cores that run partials
 * (1 ..= 4096), 2 = page size P (1 ..= 65536), 3 = the cost model of one
 * partial item: cycles per item in the low 32 bits, per token in the high
 * 32, each below 2^16.
 *
 * A length below 1 or above 2^24 rejects the call at run time, before
 * anything is written. Those bounds keep every sum below 2^64: items <= B
 * 2^24 / 128 = 2^29, tokens <= 2^36, total <= 256 (2^29 2^16 + 2^36 2^16)
 * < 2^61.
 *
 * The rule. An item is (request, KV head, chunk); it costs
 * item + token * tokens. For a chunk c (a multiple of P), total(c) is the
 * cost of every item and largest(c) that of an item of min(c, longest)
 * tokens; c fits when 8 * largest(c) * cores <= total(c). The chunk is the
 * largest c that fits, between lo = max(P, 128 rounded up to P) and
 * hi = max(lo, longest rounded up to P): hi when hi fits, lo when lo does
 * not, else a binary search over the multiples of P (fitting is monotone:
 * largest grows with c, total shrinks).
 *
 * Cost: one pass over the lengths (the longest) and one per probe, B cycles
 * each (element-wise), plus one for the store: B (probes + 1) + 1, where
 * probes = 2 + the binary search's steps. */
#include "wsp_tile.hpp"

using namespace wsp;

namespace {
constexpr uint32_t kMaxRequests = 4096;
constexpr uint64_t kWaves = 8;
constexpr uint64_t kMinChunk = 128;
constexpr int32_t kMaxLen = 1 << 24;

uint64_t round_up(uint64_t v, uint64_t m) { return (v + m - 1) / m * m; }

struct Batch {
    const int32_t *lens;
    int count;
    uint64_t heads, cores, item, token, longest, tokens;

    /* The rule's condition for chunk c. */
    bool fits(uint64_t c) const {
        uint64_t items = 0;
        for (int b = 0; b < count; ++b) items += (static_cast<uint64_t>(lens[b]) + c - 1) / c;
        const uint64_t total = heads * (items * item + tokens * token);
        const uint64_t largest = item + token * (c < longest ? c : longest);
        return kWaves * largest * cores <= total;
    }
};
}  // namespace

extern "C" uint64_t wsp_kernel_decode_plan(const WspKernelArgs *args) {
    if (args->num_tensors != 2 || args->num_scalars != 4) return WSP_KERNEL_REJECTED;
    const WspTensorView &vl = args->tensors[0];
    const WspTensorView &vp = args->tensors[1];
    if (!is_i32_tile(vl, 1, kMaxRequests) || !is_i32_tile(vp, 1, 1)) return WSP_KERNEL_REJECTED;
    const uint64_t heads = args->scalars[0], cores = args->scalars[1], page = args->scalars[2];
    const uint64_t costs = args->scalars[3];
    const uint64_t item = costs & 0xffffffffu, token = costs >> 32;
    if (heads < 1 || heads > 256 || cores < 1 || cores > 4096 || page < 1 || page > 65536 ||
        item >= (1u << 16) || token >= (1u << 16))
        return WSP_KERNEL_REJECTED;

    const View<int32_t> lens = view_of<int32_t>(vl);
    Batch batch{lens.base, lens.cols, heads, cores, item, token, 0, 0};
    for (int b = 0; b < lens.cols; ++b) {
        const int32_t len = lens.base[b];
        if (len < 1 || len > kMaxLen) return WSP_KERNEL_REJECTED;
        if (static_cast<uint64_t>(len) > batch.longest) batch.longest = len;
        batch.tokens += static_cast<uint64_t>(len);
    }
    const uint64_t lo_chunk = round_up(kMinChunk, page) > page ? round_up(kMinChunk, page) : page;
    const uint64_t hi_rounded = round_up(batch.longest, page);
    const uint64_t hi_chunk = hi_rounded > lo_chunk ? hi_rounded : lo_chunk;
    uint64_t probes = 2, chunk;
    if (batch.fits(hi_chunk)) {
        chunk = hi_chunk;
        probes = 1;
    } else if (!batch.fits(lo_chunk)) {
        chunk = lo_chunk;
    } else {
        /* Invariant: fits(lo * page), !fits(hi * page). */
        uint64_t lo = lo_chunk / page, hi = hi_chunk / page;
        while (hi - lo > 1) {
            const uint64_t mid = lo + (hi - lo) / 2;
            if (batch.fits(mid * page))
                lo = mid;
            else
                hi = mid;
            ++probes;
        }
        chunk = lo * page;
    }
    view_of<int32_t>(vp).base[0] = static_cast<int32_t>(chunk);
    return static_cast<Cycles>(lens.cols) * (probes + 1) + 1;
}
