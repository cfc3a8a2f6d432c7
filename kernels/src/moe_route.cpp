/* Mixture-of-Experts routing of one tile of tokens (vector core), for any
 * number of tokens (one task per tile of at most 64): per token, its top-k
 * experts of softmax(logits) whose probability reaches a threshold (so a
 * token may keep anywhere from k down to 0 experts), weights renormalised
 * over the kept ones, written per token in pick order.
 *
 * Tensors: 0 = logits (in, f32, R x E, R <= 64 tokens, E <= 64 experts),
 * 1 = ids (out, i32, R x k, k <= 64), 2 = weights (out, f32, R x k).
 * Scalar 0 = threshold, f32 bits in the low 32 bits (high bits zero),
 * 0 <= threshold < 1 (0 keeps every pick: exactly k experts per token).
 *
 * Per token t (row t of logits):
 *   1. p = softmax(logits[t, :]) in f32 exactly as the softmax kernel does it
 *      (row max, subtract, exp, row sum left to right, divide).
 *   2. k selection passes: pass i picks the unselected expert with the largest
 *      p, the lowest index on ties (a strict > scan in increasing e); a pass
 *      with no expert left (k > E) picks none.
 *   3. A pick is kept unless p < threshold. Picks come largest p first, so
 *      the kept ones are a prefix of the picks.
 *   4. s = the f32 sum of p over the kept picks, in pick order; each kept
 *      expert's weight is p_e / s.
 * Output: ids[t, i] = the i-th kept expert and weights[t, i] its weight for
 * i < kept; ids[t, i] = -1 and weights[t, i] = 0 after.
 *
 * Cost, independent of the data (normalisation charged for every slot):
 *   softmax: load, row max, subtract, exp, row sum, divide  6 x R x E
 *   clear the pick flags                                    R x E
 *   k selection passes                                      k x R x E
 *   normalisation: sum and divide                           2 x R x k
 *   ids and weights written                                 2 x R x k
 * total = (7 + k) x R x E + 4 x R x k. */
#include "wsp_tile.hpp"

using namespace wsp;

namespace {
constexpr int kMaxTokens = 64;
constexpr int kMaxExperts = 64;
constexpr int kMaxK = 64;
using Probs = Tile<float, kMaxTokens, kMaxExperts>;
using Column = Tile<float, kMaxTokens, 1>;
using Flags = Tile<uint8_t, kMaxTokens, kMaxExperts>;
}  // namespace

extern "C" uint64_t wsp_kernel_moe_route(const WspKernelArgs *args) {
    if (args->num_tensors != 3 || args->num_scalars != 1) return WSP_KERNEL_REJECTED;
    const WspTensorView &vl = args->tensors[0];
    const WspTensorView &vi = args->tensors[1];
    const WspTensorView &vw = args->tensors[2];
    if (!is_f32_tile(vl, kMaxTokens, kMaxExperts) || !is_i32_tile(vi, kMaxTokens, kMaxK) ||
        !is_f32_tile(vw, kMaxTokens, kMaxK) || vi.rows != vl.rows || !same_shape(vi, vw))
        return WSP_KERNEL_REJECTED;
    float threshold;
    if (!threshold_from_scalar(args->scalars[0], &threshold)) return WSP_KERNEL_REJECTED;

    const int tokens = static_cast<int>(vl.rows);
    const int experts = static_cast<int>(vl.cols);
    const int picks = static_cast<int>(vi.cols);

    Probs p;
    Column m, s;
    Cycles cost = 0;
    cost += TLOAD(p, view_of<float>(vl));
    cost += TROWMAX(m, p);
    cost += TROWEXPANDSUB(p, p, m);
    cost += TEXP(p, p);
    cost += TROWSUM(s, p);
    cost += TROWEXPANDDIV(p, p, s);

    Flags taken;
    cost += TEXPANDS(taken, tokens, experts, static_cast<uint8_t>(0));
    const View<int32_t> ids = view_of<int32_t>(vi);
    const View<float> weights = view_of<float>(vw);
    for (int t = 0; t < tokens; ++t) {
        int order[kMaxK];
        int kept = 0;
        for (int i = 0; i < picks; ++i) {
            int best = -1;
            float best_p = 0.0f;
            for (int e = 0; e < experts; ++e) {
                const float v = p.at(t, e);
                if (!taken.at(t, e) && (best < 0 || v > best_p)) {
                    best = e;
                    best_p = v;
                }
            }
            if (best < 0) break;
            taken.at(t, best) = 1;
            /* Picks come in decreasing p: once one is dropped, all later are. */
            if (best_p < threshold) break;
            order[kept++] = best;
        }
        float sum = 0.0f;
        for (int i = 0; i < kept; ++i) sum = sum + p.at(t, order[i]);
        int32_t *id_row = ids.base + static_cast<intptr_t>(t) * ids.stride;
        float *w_row = weights.base + static_cast<intptr_t>(t) * weights.stride;
        for (int i = 0; i < picks; ++i) {
            id_row[i] = i < kept ? order[i] : -1;
            w_row[i] = i < kept ? p.at(t, order[i]) / sum : 0.0f;
        }
    }
    cost += cells(tokens, experts) * static_cast<Cycles>(picks);
    cost += 4 * cells(tokens, picks);
    return cost;
}
