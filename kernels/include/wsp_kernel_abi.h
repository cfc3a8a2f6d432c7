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
 * indices and counts (the outputs of ROUTE_TOPK). */
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
 * arguments break its contract (wrong count, shape mismatch, tile too large).
 * The runtime validates arguments before launch, so a rejection is a bug
 * that the runtime reports as a typed error, never a silent result. */
#define WSP_KERNEL_REJECTED UINT64_MAX

typedef uint64_t (*WspKernelEntry)(const WspKernelArgs *args);

uint64_t wsp_kernel_add(const WspKernelArgs *args);
uint64_t wsp_kernel_gemm_tile(const WspKernelArgs *args);
uint64_t wsp_kernel_rmsnorm(const WspKernelArgs *args);
uint64_t wsp_kernel_softmax(const WspKernelArgs *args);
uint64_t wsp_kernel_route_topk(const WspKernelArgs *args);
uint64_t wsp_kernel_expert_rows(const WspKernelArgs *args);

#ifdef __cplusplus
}
#endif

#endif /* WSP_KERNEL_ABI_H */
