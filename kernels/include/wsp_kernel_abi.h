/*
 * pto-wsp kernel ABI: the one contract between the runtime and every tile kernel.
 *
 * Every kernel has the same entry signature:
 *
 *     uint64_t wsp_kernel_<name>(const WspKernelArgs *args);
 *
 * It reads its tensor views and scalars from `args`, computes, and returns its
 * cost in semantic cycles under the cost model of pto-wsp (see wsp_tile.hpp):
 * TLOAD / TSTORE / elementwise ops cost valid rows x cols of the destination,
 * TMATMUL costs M * K * N.
 *
 * This header is C (bindgen reads it) and C++ (the kernels include it).
 * Changing it changes ABI: regenerate the bindings with `cargo xtask bindgen`.
 */
#ifndef WSP_KERNEL_ABI_H
#define WSP_KERNEL_ABI_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Capacities of one argument block. */
#define WSP_MAX_TENSOR_ARGS 4
#define WSP_MAX_SCALARS 4

/* Element types. The kernels compute on F32; I32 (4-byte signed int) holds
 * indices and counts (the outputs of ROUTE_TOPK and TOPK, page tables). */
enum WspDtype {
    WSP_DTYPE_F32 = 1,
    WSP_DTYPE_I32 = 2,
};

/* Kernel identifiers: stable numbers shared by tables, the registry and kernels. */
enum WspKernelId {
    /* C = A + B, elementwise on a tile (vector core). */
    WSP_KERNEL_ADD = 1,
    /* C += A x B on f32 tiles (cube core). */
    WSP_KERNEL_GEMM_TILE = 2,
    /* Y = X / sqrt(mean(X^2) + eps) * G per row (vector core); scalar 0 = eps as f32 bits. */
    WSP_KERNEL_RMSNORM = 3,
    /* Y = softmax(X) per row (vector core). */
    WSP_KERNEL_SOFTMAX = 4,
    /* Mixture-of-Experts routing (vector core): per token (row of f32 logits),
     * the top-k experts of softmax(logits) above a threshold, with weights
     * renormalised over the kept experts, written grouped by expert in CSR
     * form (i32 indptr, i32 token indices, f32 weights). Scalar 0 = k,
     * scalar 1 = threshold as f32 bits. */
    WSP_KERNEL_ROUTE_TOPK = 5,
    /* OUT[r, :] += GATE[r, 0] * (X[r, :] x W) on f32 tiles (cube core): one
     * expert's rows, W one expert's weight matrix. */
    WSP_KERNEL_EXPERT_ROWS = 6,
    /* Attention kernels. One log base everywhere: base 2. A partial state of
     * G query rows over a set of KV tokens is G rows of D + 2 f32 columns:
     * o[0..D] = sum_i p_i v_i / sum_i p_i, then m = max_i s2_i with
     * s2_i = scale * (q . k_i) * log2(e), then l = sum_i 2^(s2_i - m); so
     * m + log2(l) is the set's log-sum-exp in base 2. A paged KV pool of one
     * KV head is an f32 region of pages * 2P rows x D cols: page p's keys are
     * rows p*2P .. p*2P+P, its values rows p*2P+P .. (p+1)*2P; token t of a
     * request lives on page table[t / P], row t % P of that page. */
    /* Partial state of tokens first .. first+n of one request (cube core).
     * Tensors: q [G x D], kv pool, table i32 [1 x W], part out [G x (D+2)].
     * Scalars: first, n, page size P, scale (f32 bits). */
    WSP_KERNEL_ATTN_DECODE_PARTIAL = 7,
    /* Merges n partial states of the same G rows (vector core). Tensors:
     * parts [n*G x (D+2)], out [G x (D+2)] (a state) or [G x D] (o only).
     * Scalar: n. */
    WSP_KERNEL_ATTN_MERGE = 8,
    /* Lightning-indexer scores of one query token (cube core):
     * I[s] = sum_j w[j] * ReLU(q[j] . k[s]). Tensors: q [H x Dq], w [1 x H],
     * k [S x Dq], scores out [1 x S]. No scalars. */
    WSP_KERNEL_INDEXER_SCORES = 9,
    /* Positions of the k largest scores, ties toward the lower position,
     * written in increasing position order (vector core). Tensors:
     * scores [1 x L], idx out i32 [1 x k]. Scalar: k. */
    WSP_KERNEL_TOPK = 10,
    /* Partial state over selected tokens (cube core). Tensors: q [G x D],
     * kv pool, meta i32 [2 x W] (row 0 page table, row 1 selected
     * positions), part out [G x (D+2)]. Scalars: n selected, page size P,
     * scale (f32 bits), context length Lc. */
    WSP_KERNEL_ATTN_SPARSE_PARTIAL = 11,
    /* The decode planner's KV chunk size from the requests' lengths
     * (vector core). Tensors: lens i32 [1 x B], plan out i32 [1 x 1].
     * Scalars: KV heads, cores, page size P, the partial's cost model
     * (per item in the low 32 bits, per token in the high 32). */
    WSP_KERNEL_DECODE_PLAN = 12,
    /* OUT = SiLU(G) * U elementwise, SiLU(g) = g / (1 + e^-g), on f32 tiles
     * (vector core). Tensors: G, U (in), OUT (out), one shape. No scalars. */
    WSP_KERNEL_SILU_MUL = 13,
    /* MoE routing of a tile of tokens (vector core): per token, its top-k
     * experts of softmax(logits) with p >= threshold (k down to 0 kept),
     * renormalised. Tensors: logits f32 [R x E], ids out i32 [R x k] (-1:
     * none), weights out f32 [R x k]. Scalar: threshold (f32 bits). */
    WSP_KERNEL_MOE_ROUTE = 14,
    /* MoE alignment (vector core): the (token, slot) pairs sorted by expert,
     * each expert's run padded to a multiple of the tile height M. Tensors:
     * ids i32 [T x k], tiles out i32 [1 x (E + 1)] (each expert's first
     * tile), rows out i32 [P x 1] (token per row, -1 padding), slot out i32
     * [T x k] (each pair's row, -1 none). Scalar: M. */
    WSP_KERNEL_MOE_ALIGN = 15,
    /* Weighted row gather (vector core): OUT[r, :] = sum_s W[r, s] *
     * SRC[IDX[r, s], :], IDX = -1 skipped. Tensors: IDX i32 [R x S], W f32
     * [R x S], SRC f32 [N x C], OUT out f32 [R x C]. No scalars. */
    WSP_KERNEL_GATHER_ROWS = 16,
    /* C = A x B on f32 tiles (cube core), C written without being read:
     * the first (or only) product of a chain, where GEMM_TILE would load a
     * zero C. */
    WSP_KERNEL_MATMUL = 17,
    /* C = A * A, elementwise on a tile (vector core). */
    WSP_KERNEL_SQUARE = 18,
    /* Y = X element by element in row-major order, between layouts of the
     * same number of elements (vector core): a load and a store. Tensors:
     * X, Y out. No scalars. */
    WSP_KERNEL_COPY = 19,
    /* Rotary position embedding of one token's n heads of D (vector core,
     * half-split pairing). Tensors: X [1 x n*D] or [n x D], CS [1 x D] (the
     * position's cos in columns 0 .. D/2, sin in D/2 .. D), Y out [n x D].
     * No scalars. */
    WSP_KERNEL_ROPE = 20,
};

/* A 2-D view of a tensor region: `rows` x `cols` valid elements starting at
 * `addr`, consecutive rows `row_stride` elements apart. */
typedef struct WspTensorView {
    uint64_t addr;
    uint32_t rows;
    uint32_t cols;
    uint32_t row_stride;
    uint32_t dtype;
} WspTensorView;

/* The argument block handed to a kernel. Tensors come in the order of the
 * kernel's signature; unused entries are zero. Scalars are raw 64-bit values
 * (an f32 scalar is its bit pattern in the low 32 bits). */
typedef struct WspKernelArgs {
    uint32_t num_tensors;
    uint32_t num_scalars;
    WspTensorView tensors[WSP_MAX_TENSOR_ARGS];
    uint64_t scalars[WSP_MAX_SCALARS];
} WspKernelArgs;

/* A kernel returns its cost in cycles, or WSP_KERNEL_REJECTED when its
 * arguments break its contract (wrong count, shape mismatch, tile too large)
 * or, for the kernels that read indices from tensors, when the data holds a
 * bad index (a page outside the pool, a position past the context, a NaN
 * score); such a kernel checks all its indices before writing any output.
 * The runtime validates shapes and scalars before launch, so a rejection is
 * bad data or a bug, which the runtime reports as a typed error naming the
 * task, never a silent result. */
#define WSP_KERNEL_REJECTED UINT64_MAX

/* A kernel (or the core running it) that fails for a reason other than its
 * arguments (a fault it detects, a device error) returns
 * WSP_KERNEL_FAILED_BASE | code, with a 32-bit error code in the low bits:
 * the values from WSP_KERNEL_FAILED_BASE to WSP_KERNEL_FAILED_BASE +
 * 0xFFFFFFFF are reserved for it (no kernel costs 2^64 - 2^33 cycles). The
 * runtime reports it as a typed error naming the task, kernel, core and
 * code. */
#define WSP_KERNEL_FAILED_BASE 0xFFFFFFFE00000000ULL

typedef uint64_t (*WspKernelEntry)(const WspKernelArgs *args);

uint64_t wsp_kernel_add(const WspKernelArgs *args);
uint64_t wsp_kernel_gemm_tile(const WspKernelArgs *args);
uint64_t wsp_kernel_rmsnorm(const WspKernelArgs *args);
uint64_t wsp_kernel_softmax(const WspKernelArgs *args);
uint64_t wsp_kernel_route_topk(const WspKernelArgs *args);
uint64_t wsp_kernel_expert_rows(const WspKernelArgs *args);
uint64_t wsp_kernel_attn_decode_partial(const WspKernelArgs *args);
uint64_t wsp_kernel_attn_merge(const WspKernelArgs *args);
uint64_t wsp_kernel_indexer_scores(const WspKernelArgs *args);
uint64_t wsp_kernel_topk(const WspKernelArgs *args);
uint64_t wsp_kernel_attn_sparse_partial(const WspKernelArgs *args);
uint64_t wsp_kernel_decode_plan(const WspKernelArgs *args);
uint64_t wsp_kernel_silu_mul(const WspKernelArgs *args);
uint64_t wsp_kernel_moe_route(const WspKernelArgs *args);
uint64_t wsp_kernel_moe_align(const WspKernelArgs *args);
uint64_t wsp_kernel_gather_rows(const WspKernelArgs *args);
uint64_t wsp_kernel_rope(const WspKernelArgs *args);
uint64_t wsp_kernel_matmul(const WspKernelArgs *args);
uint64_t wsp_kernel_square(const WspKernelArgs *args);
uint64_t wsp_kernel_copy(const WspKernelArgs *args);

#ifdef __cplusplus
}
#endif

#endif /* WSP_KERNEL_ABI_H */
