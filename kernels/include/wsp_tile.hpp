/*
 * wsp_tile.hpp: the pto-wsp tile API, in the style of PTO-ISA.
 *
 * C++17, freestanding: no exceptions, no RTTI, no libstdc++, no heap, no
 * static objects, no libm. Kernels are built with -ffp-contract=off and
 * -fno-math-errno, and every op below walks its elements in a fixed order, so
 * a host (x86_64) build and an aarch64 build give bit-identical results.
 *
 * A Tile<T, Rows, Cols> holds up to Rows x Cols elements in row-major storage
 * inside the object (capacity is fixed at compile time, no allocation) and a
 * runtime valid region of valid_rows x valid_cols. Ops read and write only the
 * valid region. Preconditions (shapes agree, views fit the tile) are checked
 * by the kernels before the first op; the ops themselves do not check them.
 *
 * Cost model (semantic cycles; every op returns its cost and kernels sum it):
 *   TLOAD, TSTORE                      valid rows x cols moved
 *   TEXPANDS (fill with a scalar)      valid rows x cols of the destination
 *   elementwise (TADD, TSUB, TMUL, TMAX, TEXP, TEXP2, TRELU, TSQRT, TADDS,
 *   TMULS, TDIVS)
 *                                      valid rows x cols of the destination
 *   row reductions (TROWSUM, TROWMAX)  valid rows x cols of the source
 *   broadcasts (TROWEXPAND*, TCOLEXPAND*)
 *                                      valid rows x cols of the destination
 *   TMATMUL (C += A x B)               M * K * N
 */
#ifndef WSP_TILE_HPP
#define WSP_TILE_HPP

#include <stdint.h>

#include "wsp_kernel_abi.h"

namespace wsp {

using Cycles = uint64_t;

template <typename T, int Rows, int Cols>
struct Tile {
    static_assert(Rows > 0 && Cols > 0, "a tile holds at least one element");
    static constexpr int kRows = Rows;
    static constexpr int kCols = Cols;

    alignas(16) T data[Rows * Cols];
    int valid_rows;
    int valid_cols;

    T &at(int r, int c) { return data[r * Cols + c]; }
    const T &at(int r, int c) const { return data[r * Cols + c]; }
};

/* A strided 2-D window of global memory: `rows` x `cols` elements from
 * `base`, consecutive rows `stride` elements apart. */
template <typename T>
struct View {
    T *base;
    int rows;
    int cols;
    int stride;

    /* Rows [first, first + count) of this view. */
    View row_block(int first, int count) const {
        return View{base + static_cast<intptr_t>(first) * stride, count, cols, stride};
    }
};

/* The view a WspTensorView describes. The caller has checked its shape. */
template <typename T>
inline View<T> view_of(const WspTensorView &v) {
    return View<T>{reinterpret_cast<T *>(static_cast<uintptr_t>(v.addr)),
                   static_cast<int>(v.rows), static_cast<int>(v.cols),
                   static_cast<int>(v.row_stride)};
}

inline Cycles cells(int rows, int cols) {
    return static_cast<Cycles>(rows) * static_cast<Cycles>(cols);
}

/* ---- data movement ------------------------------------------------------ */

/* dst = src (the whole view); dst's valid region becomes the view's shape. */
template <typename T, int R, int C>
Cycles TLOAD(Tile<T, R, C> &dst, const View<T> &src) {
    dst.valid_rows = src.rows;
    dst.valid_cols = src.cols;
    for (int r = 0; r < src.rows; ++r) {
        const T *row = src.base + static_cast<intptr_t>(r) * src.stride;
        for (int c = 0; c < src.cols; ++c) dst.at(r, c) = row[c];
    }
    return cells(src.rows, src.cols);
}

/* dst = src's valid region; elements of dst outside it are not touched. */
template <typename T, int R, int C>
Cycles TSTORE(const View<T> &dst, const Tile<T, R, C> &src) {
    for (int r = 0; r < src.valid_rows; ++r) {
        T *row = dst.base + static_cast<intptr_t>(r) * dst.stride;
        for (int c = 0; c < src.valid_cols; ++c) row[c] = src.at(r, c);
    }
    return cells(src.valid_rows, src.valid_cols);
}

/* dst = s on a rows x cols valid region (rows <= R, cols <= C), which becomes
 * dst's valid region. */
template <typename T, int R, int C>
Cycles TEXPANDS(Tile<T, R, C> &dst, int rows, int cols, T s) {
    dst.valid_rows = rows;
    dst.valid_cols = cols;
    for (int r = 0; r < rows; ++r)
        for (int c = 0; c < cols; ++c) dst.at(r, c) = s;
    return cells(rows, cols);
}

/* ---- elementwise ------------------------------------------------------- */
/* dst may be the same tile as a source. */

template <typename T, int R, int C, typename F>
Cycles map2(Tile<T, R, C> &dst, const Tile<T, R, C> &a, const Tile<T, R, C> &b, F f) {
    dst.valid_rows = a.valid_rows;
    dst.valid_cols = a.valid_cols;
    for (int r = 0; r < a.valid_rows; ++r)
        for (int c = 0; c < a.valid_cols; ++c) dst.at(r, c) = f(a.at(r, c), b.at(r, c));
    return cells(dst.valid_rows, dst.valid_cols);
}

template <typename T, int R, int C, typename F>
Cycles map1(Tile<T, R, C> &dst, const Tile<T, R, C> &src, F f) {
    dst.valid_rows = src.valid_rows;
    dst.valid_cols = src.valid_cols;
    for (int r = 0; r < src.valid_rows; ++r)
        for (int c = 0; c < src.valid_cols; ++c) dst.at(r, c) = f(src.at(r, c));
    return cells(dst.valid_rows, dst.valid_cols);
}

template <typename T, int R, int C>
Cycles TADD(Tile<T, R, C> &dst, const Tile<T, R, C> &a, const Tile<T, R, C> &b) {
    return map2(dst, a, b, [](T x, T y) { return x + y; });
}

template <typename T, int R, int C>
Cycles TSUB(Tile<T, R, C> &dst, const Tile<T, R, C> &a, const Tile<T, R, C> &b) {
    return map2(dst, a, b, [](T x, T y) { return x - y; });
}

/* max(a, b); a NaN in b is passed on, one in a only when b is not larger. */
template <typename T, int R, int C>
Cycles TMAX(Tile<T, R, C> &dst, const Tile<T, R, C> &a, const Tile<T, R, C> &b) {
    return map2(dst, a, b, [](T x, T y) { return y > x ? y : (y == y ? x : y); });
}

/* max(x, 0); a NaN stays NaN. */
template <typename T, int R, int C>
Cycles TRELU(Tile<T, R, C> &dst, const Tile<T, R, C> &src) {
    return map1(dst, src, [](T x) { return x < T(0) ? T(0) : x; });
}

template <typename T, int R, int C>
Cycles TMUL(Tile<T, R, C> &dst, const Tile<T, R, C> &a, const Tile<T, R, C> &b) {
    return map2(dst, a, b, [](T x, T y) { return x * y; });
}

template <typename T, int R, int C>
Cycles TADDS(Tile<T, R, C> &dst, const Tile<T, R, C> &src, T s) {
    return map1(dst, src, [s](T x) { return x + s; });
}

template <typename T, int R, int C>
Cycles TMULS(Tile<T, R, C> &dst, const Tile<T, R, C> &src, T s) {
    return map1(dst, src, [s](T x) { return x * s; });
}

template <typename T, int R, int C>
Cycles TDIVS(Tile<T, R, C> &dst, const Tile<T, R, C> &src, T s) {
    return map1(dst, src, [s](T x) { return x / s; });
}

/* Correctly rounded square root: one instruction on x86_64 (sqrtss) and
 * aarch64 (fsqrt) given -fno-math-errno. */
template <int R, int C>
Cycles TSQRT(Tile<float, R, C> &dst, const Tile<float, R, C> &src) {
    return map1(dst, src, [](float x) { return __builtin_sqrtf(x); });
}

/* exp(x) in f32 without libm: x = k ln2 + r with |r| <= ln2/2 (Cody-Waite,
 * ln2 split in two so k * LN2_HI is exact), a degree-7 Taylor polynomial for
 * e^r (truncation error < 1e-8), then a scale by 2^k built from exponent bits.
 * Relative error is a few ulp (< 1e-6) on [-87, 88]; results below the
 * normal range are scaled in two steps, and x < -104 gives 0. */
inline float pow2i(int e) { /* 2^e for -126 <= e <= 127 */
    return __builtin_bit_cast(float, static_cast<uint32_t>(e + 127) << 23);
}

inline float exp_f32(float x) {
    if (x != x) return x;
    if (x > 88.72283935546875f) return __builtin_inff();
    if (x < -103.97208404541015625f) return 0.0f;

    const float kLog2e = 1.44269502162933349609375f;
    const float kLn2Hi = 0.693145751953125f;       /* 0x3f317200 */
    const float kLn2Lo = 1.42860682030941723212e-6f; /* ln2 - kLn2Hi */
    const float t = x * kLog2e;
    const int k = static_cast<int>(t < 0.0f ? t - 0.5f : t + 0.5f);
    const float kf = static_cast<float>(k);
    const float r = (x - kf * kLn2Hi) - kf * kLn2Lo;

    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;

    if (k > 127) return p * pow2i(k - 1) * 2.0f;
    if (k < -126) return p * pow2i(k + 64) * pow2i(-64);
    return p * pow2i(k);
}

template <int R, int C>
Cycles TEXP(Tile<float, R, C> &dst, const Tile<float, R, C> &src) {
    return map1(dst, src, exp_f32);
}

/* 2^x in f32 without libm: x = k + r with k = x rounded half away from zero
 * and |r| <= 1/2 (x - k is exact in f32), 2^r = e^(r ln2) by the degree-7
 * Taylor polynomial of exp_f32 (|r ln2| <= 0.35, truncation < 6e-9), then a
 * scale by 2^k from exponent bits. Relative error a few ulp (< 1e-6) on
 * [-126, 128); x >= 128 gives +inf, x < -150 (and -inf) gives 0. */
inline float exp2_f32(float x) {
    if (x != x) return x;
    if (x >= 128.0f) return __builtin_inff();
    if (x < -150.0f) return 0.0f;

    const float kLn2 = 0.693147182464599609375f;
    const int k = static_cast<int>(x < 0.0f ? x - 0.5f : x + 0.5f);
    const float r = (x - static_cast<float>(k)) * kLn2;

    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;

    if (k > 127) return p * pow2i(k - 1) * 2.0f;
    if (k < -126) return p * pow2i(k + 64) * pow2i(-64);
    return p * pow2i(k);
}

template <int R, int C>
Cycles TEXP2(Tile<float, R, C> &dst, const Tile<float, R, C> &src) {
    return map1(dst, src, exp2_f32);
}

/* ---- row reductions ---------------------------------------------------- */
/* dst is a column tile: dst(r, 0) reduces row r of src, left to right. */

template <typename T, int R, int C>
Cycles TROWSUM(Tile<T, R, 1> &dst, const Tile<T, R, C> &src) {
    dst.valid_rows = src.valid_rows;
    dst.valid_cols = 1;
    for (int r = 0; r < src.valid_rows; ++r) {
        T acc = src.at(r, 0);
        for (int c = 1; c < src.valid_cols; ++c) acc = acc + src.at(r, c);
        dst.at(r, 0) = acc;
    }
    return cells(src.valid_rows, src.valid_cols);
}

template <typename T, int R, int C>
Cycles TROWMAX(Tile<T, R, 1> &dst, const Tile<T, R, C> &src) {
    dst.valid_rows = src.valid_rows;
    dst.valid_cols = 1;
    for (int r = 0; r < src.valid_rows; ++r) {
        T acc = src.at(r, 0);
        for (int c = 1; c < src.valid_cols; ++c) {
            const T v = src.at(r, c);
            acc = v > acc ? v : acc;
        }
        dst.at(r, 0) = acc;
    }
    return cells(src.valid_rows, src.valid_cols);
}

/* ---- broadcasts -------------------------------------------------------- */
/* TROWEXPAND*: dst(r, c) = src(r, c) op col(r, 0).
 * TCOLEXPAND*: dst(r, c) = src(r, c) op row(0, c). */

template <typename T, int R, int C, typename F>
Cycles row_expand(Tile<T, R, C> &dst, const Tile<T, R, C> &src, const Tile<T, R, 1> &col, F f) {
    dst.valid_rows = src.valid_rows;
    dst.valid_cols = src.valid_cols;
    for (int r = 0; r < src.valid_rows; ++r) {
        const T s = col.at(r, 0);
        for (int c = 0; c < src.valid_cols; ++c) dst.at(r, c) = f(src.at(r, c), s);
    }
    return cells(dst.valid_rows, dst.valid_cols);
}

template <typename T, int R, int C>
Cycles TROWEXPANDSUB(Tile<T, R, C> &dst, const Tile<T, R, C> &src, const Tile<T, R, 1> &col) {
    return row_expand(dst, src, col, [](T x, T s) { return x - s; });
}

template <typename T, int R, int C>
Cycles TROWEXPANDMUL(Tile<T, R, C> &dst, const Tile<T, R, C> &src, const Tile<T, R, 1> &col) {
    return row_expand(dst, src, col, [](T x, T s) { return x * s; });
}

template <typename T, int R, int C>
Cycles TROWEXPANDDIV(Tile<T, R, C> &dst, const Tile<T, R, C> &src, const Tile<T, R, 1> &col) {
    return row_expand(dst, src, col, [](T x, T s) { return x / s; });
}

template <typename T, int R, int C>
Cycles TCOLEXPANDMUL(Tile<T, R, C> &dst, const Tile<T, R, C> &src, const Tile<T, 1, C> &row) {
    dst.valid_rows = src.valid_rows;
    dst.valid_cols = src.valid_cols;
    for (int r = 0; r < src.valid_rows; ++r)
        for (int c = 0; c < src.valid_cols; ++c) dst.at(r, c) = src.at(r, c) * row.at(0, c);
    return cells(dst.valid_rows, dst.valid_cols);
}

/* ---- matrix multiply --------------------------------------------------- */

/* c += a x b with a: M x K, b: K x N, c: M x N (valid regions). Loop order
 * i, k, j: each c(i, j) accumulates its products in increasing k. */
template <typename T, int M, int K, int N>
Cycles TMATMUL(Tile<T, M, N> &c, const Tile<T, M, K> &a, const Tile<T, K, N> &b) {
    const int m = a.valid_rows, k = a.valid_cols, n = b.valid_cols;
    for (int i = 0; i < m; ++i)
        for (int p = 0; p < k; ++p) {
            const T av = a.at(i, p);
            for (int j = 0; j < n; ++j) c.at(i, j) = c.at(i, j) + av * b.at(p, j);
        }
    return cells(m, k) * static_cast<Cycles>(n);
}

/* ---- argument checks (shared by the kernels) ---------------------------- */

/* A non-empty view of `dtype` elements within max_rows x max_cols. */
inline bool is_tile(const WspTensorView &v, uint32_t dtype, uint32_t max_rows,
                    uint32_t max_cols) {
    return v.dtype == dtype && v.rows != 0 && v.cols != 0 && v.rows <= max_rows &&
           v.cols <= max_cols;
}

inline bool is_f32_tile(const WspTensorView &v, uint32_t max_rows, uint32_t max_cols) {
    return is_tile(v, WSP_DTYPE_F32, max_rows, max_cols);
}

inline bool is_i32_tile(const WspTensorView &v, uint32_t max_rows, uint32_t max_cols) {
    return is_tile(v, WSP_DTYPE_I32, max_rows, max_cols);
}

inline bool same_shape(const WspTensorView &a, const WspTensorView &b) {
    return a.rows == b.rows && a.cols == b.cols;
}

/* A routing threshold scalar: valid when its high bits are zero and it is
 * finite with 0 <= threshold < 1 (a NaN fails the comparison; -0 is
 * accepted as 0). */
inline bool threshold_from_scalar(uint64_t raw, float *threshold) {
    if ((raw >> 32) != 0) return false;
    const float t = __builtin_bit_cast(float, static_cast<uint32_t>(raw));
    if (!(t >= 0.0f && t < 1.0f)) return false;
    *threshold = t;
    return true;
}

}  // namespace wsp

#endif /* WSP_TILE_HPP */
