/* Top-k selection (vector core): the positions of the k largest scores.
 *
 * Tensors: 0 = scores (in, f32, 1 x L, L <= 16384), 1 = idx (out, i32,
 * 1 x k). Scalar 0 = k with 1 <= k <= min(L, 2048) and idx cols = k.
 *
 * Order: score a ranks above score b when a > b, or a == b (as f32 values,
 * so -0 == +0) and a's position is lower: ties go to the lower position.
 * The k highest-ranked positions are written in increasing position order.
 * A NaN score rejects the call at run time, before anything is written.
 *
 * Method: one pass over the scores in increasing position keeps the best k
 * so far in a binary min-heap of (score, position) pairs ordered by rank; a
 * later position enters only with a strictly larger score than the heap's
 * lowest-ranked entry (which wins a tie, having the lower position). Then a
 * heapsort orders the k positions. Stack: the heap, 2048 x (4 + 4) B =
 * 16 KiB, whatever L is: the scores are read in place, never copied. L is
 * bounded by the 1 x 16384 contract (the longest context one call indexes),
 * not by the stack.
 *
 * Cost, charged at the worst case (every score enters the heap and sinks
 * through all its levels) so that it does not depend on the data, with
 * depth = floor(log2 k) + 1 heap levels:
 *   NaN check and heap pass 2 L + L depth; sort k depth; store k
 * total = L (2 + depth) + k (depth + 1). */
#include "wsp_tile.hpp"

using namespace wsp;

namespace {
constexpr uint32_t kMaxScores = 16384;
constexpr uint32_t kMaxK = 2048;

/* (score, position) a ranks below b. */
inline bool below(float as, int32_t ap, float bs, int32_t bp) {
    return as < bs || (as == bs && ap > bp);
}

/* Restores the min-heap (by rank) below slot i of a heap of `size`. */
void sift_down(float *score, int32_t *pos, int size, int i) {
    for (;;) {
        const int l = 2 * i + 1, r = l + 1;
        int low = i;
        if (l < size && below(score[l], pos[l], score[low], pos[low])) low = l;
        if (r < size && below(score[r], pos[r], score[low], pos[low])) low = r;
        if (low == i) return;
        const float s = score[i];
        score[i] = score[low];
        score[low] = s;
        const int32_t p = pos[i];
        pos[i] = pos[low];
        pos[low] = p;
        i = low;
    }
}

/* Restores the max-heap of positions below slot i of a heap of `size`. */
void sift_down_max(int32_t *pos, int size, int i) {
    for (;;) {
        const int l = 2 * i + 1, r = l + 1;
        int high = i;
        if (l < size && pos[l] > pos[high]) high = l;
        if (r < size && pos[r] > pos[high]) high = r;
        if (high == i) return;
        const int32_t p = pos[i];
        pos[i] = pos[high];
        pos[high] = p;
        i = high;
    }
}

Cycles levels(uint32_t k) {
    Cycles depth = 0;
    while (k != 0) {
        ++depth;
        k >>= 1;
    }
    return depth;
}
}  // namespace

extern "C" uint64_t wsp_kernel_topk(const WspKernelArgs *args) {
    if (args->num_tensors != 2 || args->num_scalars != 1) return WSP_KERNEL_REJECTED;
    const WspTensorView &vs = args->tensors[0];
    const WspTensorView &vi = args->tensors[1];
    if (!is_f32_tile(vs, 1, kMaxScores) || !is_i32_tile(vi, 1, kMaxK)) return WSP_KERNEL_REJECTED;
    const uint64_t k = args->scalars[0];
    if (k < 1 || k > vs.cols || k > kMaxK || k != vi.cols) return WSP_KERNEL_REJECTED;

    const float *scores = view_of<float>(vs).base;
    const int len = static_cast<int>(vs.cols), picks = static_cast<int>(k);
    for (int i = 0; i < len; ++i)
        if (scores[i] != scores[i]) return WSP_KERNEL_REJECTED;

    float heap_score[kMaxK];
    int32_t heap_pos[kMaxK];
    for (int i = 0; i < picks; ++i) {
        heap_score[i] = scores[i];
        heap_pos[i] = i;
    }
    for (int i = picks / 2 - 1; i >= 0; --i) sift_down(heap_score, heap_pos, picks, i);
    for (int i = picks; i < len; ++i) {
        if (!(scores[i] > heap_score[0])) continue;
        heap_score[0] = scores[i];
        heap_pos[0] = i;
        sift_down(heap_score, heap_pos, picks, 0);
    }

    /* Heapsort of the positions, increasing. */
    for (int i = picks / 2 - 1; i >= 0; --i) sift_down_max(heap_pos, picks, i);
    for (int end = picks - 1; end > 0; --end) {
        const int32_t p = heap_pos[0];
        heap_pos[0] = heap_pos[end];
        heap_pos[end] = p;
        sift_down_max(heap_pos, end, 0);
    }
    int32_t *idx = view_of<int32_t>(vi).base;
    for (int i = 0; i < picks; ++i) idx[i] = heap_pos[i];

    const Cycles depth = levels(static_cast<uint32_t>(picks));
    return static_cast<Cycles>(len) * (2 + depth) + static_cast<Cycles>(picks) * (depth + 1);
}
