/* Mixture-of-Experts routing (vector core): top-k experts per token, written
 * grouped by expert in CSR form.
 *
 * Tensors: 0 = logits (in, f32, T x E, T <= 64 tokens, E <= 64 experts),
 * 1 = indptr (out, i32, 1 x (E + 1)), 2 = tokens (out, i32, 1 x C),
 * 3 = weights (out, f32, 1 x C), with T x k <= C <= 4096.
 * Scalars: 0 = k, an integer with 1 <= k <= E; 1 = threshold, f32 bits in
 * the low 32 bits (the high 32 bits zero), finite and 0 <= threshold < 1.
 *
 * Per token t (row t of logits):
 *   1. p = softmax(logits[t, :]) in f32 exactly as the softmax kernel does it
 *      (row max, subtract, exp, row sum left to right, divide).
 *   2. k selection passes: pass i picks the unselected expert with the largest
 *      p, the lowest index on ties (a strict > scan in increasing e).
 *   3. The first pick is always kept; a later pick is dropped when
 *      p < threshold (threshold 0 keeps all k picks).
 *   4. s = the f32 sum of p over the kept picks, left to right in pick order
 *      (largest p first); each kept expert's weight is p_e / s.
 * Output: indptr[0] = 0 and indptr[e + 1] = indptr[e] + the number of tokens
 * routed to expert e; tokens[indptr[e] .. indptr[e + 1]] are those tokens in
 * increasing order and weights[...] their weights. tokens and weights at and
 * after indptr[E] are written as 0.
 *
 * Cost, independent of the data (normalisation is charged for k picks per
 * token however many are kept):
 *   softmax: load, row max, subtract, exp, row sum, divide  6 x T x E
 *   clear the pick flags (TEXPANDS)                         T x E
 *   k selection passes                                      k x T x E
 *   normalisation: sum and divide                           2 x T x k
 *   CSR scatter: scan of the flags by expert                T x E
 *   outputs written: indptr, tokens and weights             (E + 1) + 2 x C
 * total = (8 + k) x T x E + 2 x T x k + (E + 1) + 2 x C. */
#include "wsp_tile.hpp"

using namespace wsp;

namespace {
constexpr int kMaxTokens = 64;
constexpr int kMaxExperts = 64;
constexpr uint32_t kMaxSlots = kMaxTokens * kMaxExperts;
using Probs = Tile<float, kMaxTokens, kMaxExperts>;
using Column = Tile<float, kMaxTokens, 1>;
/* Per (token, expert): kFree, kPicked (selected, then dropped) or kKept. */
using Flags = Tile<uint8_t, kMaxTokens, kMaxExperts>;
constexpr uint8_t kFree = 0;
constexpr uint8_t kPicked = 1;
constexpr uint8_t kKept = 2;
}  // namespace

extern "C" uint64_t wsp_kernel_route_topk(const WspKernelArgs *args) {
    if (args->num_tensors != 4 || args->num_scalars != 2) return WSP_KERNEL_REJECTED;
    const WspTensorView &vl = args->tensors[0];
    const WspTensorView &vp = args->tensors[1];
    const WspTensorView &vt = args->tensors[2];
    const WspTensorView &vw = args->tensors[3];
    if (!is_f32_tile(vl, kMaxTokens, kMaxExperts) || !is_i32_tile(vp, 1, kMaxExperts + 1) ||
        !is_i32_tile(vt, 1, kMaxSlots) || !is_f32_tile(vw, 1, kMaxSlots) ||
        vp.cols != vl.cols + 1 || vt.cols != vw.cols)
        return WSP_KERNEL_REJECTED;
    const uint64_t k = args->scalars[0];
    if (k < 1 || k > vl.cols || static_cast<uint64_t>(vl.rows) * k > vt.cols)
        return WSP_KERNEL_REJECTED;
    float threshold;
    if (!threshold_from_scalar(args->scalars[1], &threshold)) return WSP_KERNEL_REJECTED;

    const int tokens = static_cast<int>(vl.rows);
    const int experts = static_cast<int>(vl.cols);
    const int picks = static_cast<int>(k);
    const int slots = static_cast<int>(vt.cols);

    /* 1. p = softmax per row, in place. */
    Probs p;
    Column m, s;
    Cycles cost = 0;
    cost += TLOAD(p, view_of<float>(vl));
    cost += TROWMAX(m, p);
    cost += TROWEXPANDSUB(p, p, m);
    cost += TEXP(p, p);
    cost += TROWSUM(s, p);
    cost += TROWEXPANDDIV(p, p, s);

    /* 2-4. Pick, drop, renormalise; a kept expert's p becomes its weight. */
    Flags flags;
    cost += TEXPANDS(flags, tokens, experts, kFree);
    for (int t = 0; t < tokens; ++t) {
        int order[kMaxExperts];
        for (int i = 0; i < picks; ++i) {
            int best = -1;
            float best_p = 0.0f;
            for (int e = 0; e < experts; ++e) {
                const float v = p.at(t, e);
                if (flags.at(t, e) == kFree && (best < 0 || v > best_p)) {
                    best = e;
                    best_p = v;
                }
            }
            /* best >= 0: fewer than k <= E experts are picked before this pass. */
            order[i] = best;
            flags.at(t, best) = (i == 0 || !(best_p < threshold)) ? kKept : kPicked;
        }
        float sum = 0.0f;
        for (int i = 0; i < picks; ++i)
            if (flags.at(t, order[i]) == kKept) sum = sum + p.at(t, order[i]);
        for (int i = 0; i < picks; ++i)
            if (flags.at(t, order[i]) == kKept) p.at(t, order[i]) = p.at(t, order[i]) / sum;
    }
    cost += cells(tokens, experts) * static_cast<Cycles>(picks);
    cost += 2 * cells(tokens, picks);

    /* CSR by expert, tokens in increasing order; zeros after the last entry. */
    int32_t *indptr = view_of<int32_t>(vp).base;
    int32_t *token_out = view_of<int32_t>(vt).base;
    float *weight_out = view_of<float>(vw).base;
    int pos = 0;
    indptr[0] = 0;
    for (int e = 0; e < experts; ++e) {
        for (int t = 0; t < tokens; ++t) {
            if (flags.at(t, e) != kKept) continue;
            token_out[pos] = t;
            weight_out[pos] = p.at(t, e);
            ++pos;
        }
        indptr[e + 1] = pos;
    }
    for (int i = pos; i < slots; ++i) {
        token_out[i] = 0;
        weight_out[i] = 0.0f;
    }
    cost += cells(tokens, experts);
    cost += static_cast<Cycles>(experts + 1) + 2 * static_cast<Cycles>(slots);
    return cost;
}
