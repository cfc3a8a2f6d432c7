//! The kernel registry: what the runtime knows about each kernel.

use core::fmt;

use crate::bindings::{
    wsp_kernel_add, wsp_kernel_attn_decode_partial, wsp_kernel_attn_merge,
    wsp_kernel_attn_sparse_partial, wsp_kernel_copy, wsp_kernel_decode_plan,
    wsp_kernel_expert_rows, wsp_kernel_gather_rows, wsp_kernel_gemm_tile,
    wsp_kernel_indexer_scores, wsp_kernel_matmul, wsp_kernel_moe_align, wsp_kernel_moe_route,
    wsp_kernel_rmsnorm, wsp_kernel_rope, wsp_kernel_route_topk, wsp_kernel_silu_mul,
    wsp_kernel_softmax, wsp_kernel_square, wsp_kernel_topk, WspKernelArgs, WspKernelEntry,
    WspKernelId_WSP_KERNEL_ADD, WspKernelId_WSP_KERNEL_ATTN_DECODE_PARTIAL,
    WspKernelId_WSP_KERNEL_ATTN_MERGE, WspKernelId_WSP_KERNEL_ATTN_SPARSE_PARTIAL,
    WspKernelId_WSP_KERNEL_COPY, WspKernelId_WSP_KERNEL_DECODE_PLAN,
    WspKernelId_WSP_KERNEL_EXPERT_ROWS, WspKernelId_WSP_KERNEL_GATHER_ROWS,
    WspKernelId_WSP_KERNEL_GEMM_TILE, WspKernelId_WSP_KERNEL_INDEXER_SCORES,
    WspKernelId_WSP_KERNEL_MATMUL, WspKernelId_WSP_KERNEL_MOE_ALIGN,
    WspKernelId_WSP_KERNEL_MOE_ROUTE, WspKernelId_WSP_KERNEL_RMSNORM, WspKernelId_WSP_KERNEL_ROPE,
    WspKernelId_WSP_KERNEL_ROUTE_TOPK, WspKernelId_WSP_KERNEL_SILU_MUL,
    WspKernelId_WSP_KERNEL_SOFTMAX, WspKernelId_WSP_KERNEL_SQUARE, WspKernelId_WSP_KERNEL_TOPK,
};
use crate::contract::{Equal, Extra, ScalarRule};
use crate::{DTYPE_F32, DTYPE_I32, WSP_KERNEL_REJECTED};

/// The kind of AICore a kernel runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum CoreKind {
    /// Matrix (cube) core.
    Cube = 0,
    /// Vector core.
    Vector = 1,
}

impl CoreKind {
    /// The kind with this ABI value, if any.
    pub const fn from_u32(value: u32) -> Option<Self> {
        match value {
            0 => Some(Self::Cube),
            1 => Some(Self::Vector),
            _ => None,
        }
    }
}

/// How a kernel accesses a tensor argument.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum ArgAccess {
    /// Read only.
    In = 1,
    /// Written without being read.
    Out = 2,
    /// Read, then written.
    InOut = 3,
}

impl ArgAccess {
    /// The access mode with this ABI value, if any.
    pub const fn from_u32(value: u32) -> Option<Self> {
        match value {
            1 => Some(Self::In),
            2 => Some(Self::Out),
            3 => Some(Self::InOut),
            _ => None,
        }
    }

    /// Whether the kernel reads the argument.
    pub const fn reads(self) -> bool {
        matches!(self, Self::In | Self::InOut)
    }

    /// Whether the kernel writes the argument.
    pub const fn writes(self) -> bool {
        matches!(self, Self::Out | Self::InOut)
    }
}

/// One tensor argument of a kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArgSpec {
    /// Its name in the kernel's signature.
    pub name: &'static str,
    /// Whether the kernel reads it, writes it or both.
    pub access: ArgAccess,
    /// The element type the kernel takes (`DTYPE_F32`, `DTYPE_I32`).
    pub dtype: u32,
    /// Largest number of rows the kernel accepts.
    pub max_rows: u32,
    /// Largest number of columns the kernel accepts.
    pub max_cols: u32,
}

/// A registered kernel.
#[derive(Debug)]
pub struct KernelInfo {
    /// Its id (`WspKernelId`).
    pub id: u32,
    /// Its name.
    pub name: &'static str,
    /// The kind of core it runs on.
    pub kind: CoreKind,
    /// Tensor arguments it takes.
    pub num_tensors: u32,
    /// Scalars it takes.
    pub num_scalars: u32,
    /// Its tensor arguments, in signature order.
    pub tensor_args: &'static [ArgSpec],
    /// Shape rules between arguments (see [`KernelInfo::check`]).
    pub(crate) equal: &'static [Equal],
    /// One rule per scalar.
    pub(crate) scalars: &'static [ScalarRule],
    /// Rules over several scalars and shapes, checked last.
    pub(crate) extra: &'static [Extra],
    entry: unsafe extern "C" fn(*const WspKernelArgs) -> u64,
}

/// The kernel returned `WSP_KERNEL_REJECTED`: its arguments broke its contract.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelRejected {
    /// The kernel's id.
    pub kernel: u32,
}

impl fmt::Display for KernelRejected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "kernel {} rejected its arguments", self.kernel)
    }
}

impl KernelInfo {
    /// The kernel's C entry point.
    pub fn entry(&self) -> WspKernelEntry {
        Some(self.entry)
    }

    /// Runs the kernel on `args` and returns its cost in semantic cycles.
    ///
    /// # Safety
    /// For each of the first `args.num_tensors` views (when the kernel accepts
    /// the argument count and shapes): `addr` is aligned for its dtype, and
    /// every row `r < rows`, the `cols` elements from `addr + r * row_stride`
    /// elements, is valid memory for the kernel's access to that argument
    /// (reads for `In`, writes for `Out`, both for `InOut`). No other thread
    /// writes any of these regions during the call, nor reads an `Out` or
    /// `InOut` region, and an output region overlaps no other argument's.
    pub unsafe fn invoke(&self, args: &WspKernelArgs) -> Result<u64, KernelRejected> {
        // SAFETY: `args` is a valid argument block for the duration of the
        // call; the caller guarantees the memory behind its views (see above),
        // and the kernel checks counts and shapes before touching any view.
        let cycles = unsafe { (self.entry)(args) };
        if cycles == WSP_KERNEL_REJECTED {
            Err(KernelRejected { kernel: self.id })
        } else {
            Ok(cycles)
        }
    }
}

const fn arg(
    name: &'static str,
    access: ArgAccess,
    dtype: u32,
    max_rows: u32,
    max_cols: u32,
) -> ArgSpec {
    ArgSpec {
        name,
        access,
        dtype,
        max_rows,
        max_cols,
    }
}

use crate::contract::Dim::{Cols, Rows};
use ArgAccess::{In, InOut, Out};
const F32: u32 = DTYPE_F32;
const I32: u32 = DTYPE_I32;

/// route_topk: at most 64 tokens x 64 experts, so at most 64 x 64 routed
/// (token, expert) entries.
const MAX_TOKENS: u32 = 64;
const MAX_EXPERTS: u32 = 64;
const MAX_SLOTS: u32 = MAX_TOKENS * MAX_EXPERTS;

/// Attention: query rows of one KV group (G), the head dimension (D), the
/// rows of a paged KV pool region (1 Mi rows = 512 Ki tokens of one KV head)
/// and the entries of a page table (or of selected positions).
const MAX_GROUP: u32 = 16;
const MAX_DIM: u32 = 128;
const MAX_POOL_ROWS: u32 = 1 << 20;
const MAX_TABLE: u32 = 65536;
/// attn_merge: rows of the stacked partial states (n x G).
const MAX_PART_ROWS: u32 = 4096;
/// indexer_scores: indexer heads, their dimension and keys per call.
const MAX_INDEXER_HEADS: u32 = 64;
const MAX_INDEXER_DIM: u32 = 128;
const MAX_KEYS: u32 = 1024;
/// topk: scores per call, and the largest k (the kernel's heap of k
/// (score, position) pairs takes 8 x 2048 = 16 KiB of stack).
const MAX_SCORES: u32 = 16384;
pub(crate) const MAX_TOPK: u32 = 2048;
/// decode_plan: requests per batch.
const MAX_REQUESTS: u32 = 4096;
/// `rope`'s most heads per task.
const MAX_ROPE_HEADS: u32 = 64;

/// moe_align: tokens per call (each with up to 64 (token, expert) pairs).
const MAX_ALIGN_TOKENS: u32 = 4096;
/// gather_rows: rows and cols of the source (an MoE layer's padded
/// (token, expert) rows: 4096 tokens x top-8 + 64 experts x 63 of padding
/// fit), and so the rows of moe_align's row list.
const MAX_GATHER_SRC_ROWS: u32 = 1 << 16;
const MAX_GATHER_COLS: u32 = 1024;

static KERNELS: [KernelInfo; 20] = [
    KernelInfo {
        id: WspKernelId_WSP_KERNEL_ADD,
        name: "add",
        kind: CoreKind::Vector,
        num_tensors: 3,
        num_scalars: 0,
        tensor_args: &[
            arg("a", In, F32, 64, 64),
            arg("b", In, F32, 64, 64),
            arg("c", Out, F32, 64, 64),
        ],
        equal: &[
            Equal::new(1, Rows, 0, Rows),
            Equal::new(1, Cols, 0, Cols),
            Equal::new(2, Rows, 0, Rows),
            Equal::new(2, Cols, 0, Cols),
        ],
        scalars: &[],
        extra: &[],
        entry: wsp_kernel_add,
    },
    KernelInfo {
        id: WspKernelId_WSP_KERNEL_GEMM_TILE,
        name: "gemm_tile",
        kind: CoreKind::Cube,
        num_tensors: 3,
        num_scalars: 0,
        tensor_args: &[
            arg("a", In, F32, 64, 64),
            arg("b", In, F32, 64, 64),
            arg("c", InOut, F32, 64, 64),
        ],
        equal: &[
            Equal::new(1, Rows, 0, Cols),
            Equal::new(2, Rows, 0, Rows),
            Equal::new(2, Cols, 1, Cols),
        ],
        scalars: &[],
        extra: &[],
        entry: wsp_kernel_gemm_tile,
    },
    KernelInfo {
        id: WspKernelId_WSP_KERNEL_RMSNORM,
        name: "rmsnorm",
        kind: CoreKind::Vector,
        num_tensors: 3,
        num_scalars: 1,
        tensor_args: &[
            arg("x", In, F32, 16, 1024),
            arg("g", In, F32, 1, 1024),
            arg("y", Out, F32, 16, 1024),
        ],
        equal: &[
            Equal::new(1, Cols, 0, Cols),
            Equal::new(2, Rows, 0, Rows),
            Equal::new(2, Cols, 0, Cols),
        ],
        scalars: &[ScalarRule::Eps],
        extra: &[],
        entry: wsp_kernel_rmsnorm,
    },
    KernelInfo {
        id: WspKernelId_WSP_KERNEL_SOFTMAX,
        name: "softmax",
        kind: CoreKind::Vector,
        num_tensors: 2,
        num_scalars: 0,
        tensor_args: &[arg("x", In, F32, 16, 1024), arg("y", Out, F32, 16, 1024)],
        equal: &[Equal::new(1, Rows, 0, Rows), Equal::new(1, Cols, 0, Cols)],
        scalars: &[],
        extra: &[],
        entry: wsp_kernel_softmax,
    },
    KernelInfo {
        id: WspKernelId_WSP_KERNEL_ROUTE_TOPK,
        name: "route_topk",
        kind: CoreKind::Vector,
        num_tensors: 4,
        num_scalars: 2,
        // indptr, tokens and weights are single rows (max_rows 1).
        tensor_args: &[
            arg("logits", In, F32, MAX_TOKENS, MAX_EXPERTS),
            arg("indptr", Out, I32, 1, MAX_EXPERTS + 1),
            arg("tokens", Out, I32, 1, MAX_SLOTS),
            arg("weights", Out, F32, 1, MAX_SLOTS),
        ],
        equal: &[
            Equal::new(1, Cols, 0, Cols).plus(1),
            Equal::new(3, Cols, 2, Cols),
        ],
        // k (1..=experts, tokens x k <= slots), then the threshold.
        scalars: &[
            ScalarRule::TopK {
                logits: 0,
                slots: 2,
            },
            ScalarRule::Threshold,
        ],
        extra: &[],
        entry: wsp_kernel_route_topk,
    },
    KernelInfo {
        id: WspKernelId_WSP_KERNEL_EXPERT_ROWS,
        name: "expert_rows",
        kind: CoreKind::Cube,
        num_tensors: 4,
        num_scalars: 0,
        // gate is one column (max_cols 1).
        tensor_args: &[
            arg("x", In, F32, 16, 64),
            arg("w", In, F32, 64, 64),
            arg("gate", In, F32, 16, 1),
            arg("out", InOut, F32, 16, 64),
        ],
        equal: &[
            Equal::new(1, Rows, 0, Cols),
            Equal::new(2, Rows, 0, Rows),
            Equal::new(3, Rows, 0, Rows),
            Equal::new(3, Cols, 1, Cols),
        ],
        scalars: &[],
        extra: &[],
        entry: wsp_kernel_expert_rows,
    },
    KernelInfo {
        id: WspKernelId_WSP_KERNEL_ATTN_DECODE_PARTIAL,
        name: "attn_decode_partial",
        kind: CoreKind::Cube,
        num_tensors: 4,
        num_scalars: 4,
        tensor_args: &[
            arg("q", In, F32, MAX_GROUP, MAX_DIM),
            arg("kv", In, F32, MAX_POOL_ROWS, MAX_DIM),
            arg("table", In, I32, 1, MAX_TABLE),
            arg("part", Out, F32, MAX_GROUP, MAX_DIM + 2),
        ],
        equal: &[
            Equal::new(1, Cols, 0, Cols),
            Equal::new(3, Rows, 0, Rows),
            Equal::new(3, Cols, 0, Cols).plus(2),
        ],
        // first, n, P, scale; then tokens first .. first + n in the table.
        scalars: &[
            ScalarRule::Start,
            ScalarRule::Count {
                at_most_cols_of: None,
            },
            ScalarRule::PageSize { pool: 1 },
            ScalarRule::Scale,
        ],
        extra: &[Extra::Span {
            first: Some(0),
            count: 1,
            page: 2,
            table: 2,
        }],
        entry: wsp_kernel_attn_decode_partial,
    },
    KernelInfo {
        id: WspKernelId_WSP_KERNEL_ATTN_MERGE,
        name: "attn_merge",
        kind: CoreKind::Vector,
        num_tensors: 2,
        num_scalars: 1,
        tensor_args: &[
            arg("parts", In, F32, MAX_PART_ROWS, MAX_DIM + 2),
            arg("out", Out, F32, MAX_GROUP, MAX_DIM + 2),
        ],
        equal: &[],
        scalars: &[ScalarRule::States { parts: 0, out: 1 }],
        extra: &[Extra::StateCols { out: 1, parts: 0 }],
        entry: wsp_kernel_attn_merge,
    },
    KernelInfo {
        id: WspKernelId_WSP_KERNEL_INDEXER_SCORES,
        name: "indexer_scores",
        kind: CoreKind::Cube,
        num_tensors: 4,
        num_scalars: 0,
        tensor_args: &[
            arg("q", In, F32, MAX_INDEXER_HEADS, MAX_INDEXER_DIM),
            arg("w", In, F32, 1, MAX_INDEXER_HEADS),
            arg("k", In, F32, MAX_KEYS, MAX_INDEXER_DIM),
            arg("scores", Out, F32, 1, MAX_KEYS),
        ],
        equal: &[
            Equal::new(1, Cols, 0, Rows),
            Equal::new(2, Cols, 0, Cols),
            Equal::new(3, Cols, 2, Rows),
        ],
        scalars: &[],
        extra: &[],
        entry: wsp_kernel_indexer_scores,
    },
    KernelInfo {
        id: WspKernelId_WSP_KERNEL_TOPK,
        name: "topk",
        kind: CoreKind::Vector,
        num_tensors: 2,
        num_scalars: 1,
        tensor_args: &[
            arg("scores", In, F32, 1, MAX_SCORES),
            arg("idx", Out, I32, 1, MAX_TOPK),
        ],
        equal: &[],
        scalars: &[ScalarRule::Select { scores: 0, idx: 1 }],
        extra: &[],
        entry: wsp_kernel_topk,
    },
    KernelInfo {
        id: WspKernelId_WSP_KERNEL_ATTN_SPARSE_PARTIAL,
        name: "attn_sparse_partial",
        kind: CoreKind::Cube,
        num_tensors: 4,
        num_scalars: 4,
        tensor_args: &[
            arg("q", In, F32, MAX_GROUP, MAX_DIM),
            arg("kv", In, F32, MAX_POOL_ROWS, MAX_DIM),
            arg("meta", In, I32, 2, MAX_TABLE),
            arg("part", Out, F32, MAX_GROUP, MAX_DIM + 2),
        ],
        equal: &[
            Equal::new(1, Cols, 0, Cols),
            Equal::new(3, Rows, 0, Rows),
            Equal::new(3, Cols, 0, Cols).plus(2),
        ],
        // n (<= the meta cols), P, scale, Lc; meta has 2 rows and its page
        // table covers Lc tokens.
        scalars: &[
            ScalarRule::Count {
                at_most_cols_of: Some(2),
            },
            ScalarRule::PageSize { pool: 1 },
            ScalarRule::Scale,
            ScalarRule::Count {
                at_most_cols_of: None,
            },
        ],
        extra: &[
            Extra::Rows { arg: 2, rows: 2 },
            Extra::Span {
                first: None,
                count: 3,
                page: 1,
                table: 2,
            },
        ],
        entry: wsp_kernel_attn_sparse_partial,
    },
    KernelInfo {
        id: WspKernelId_WSP_KERNEL_DECODE_PLAN,
        name: "decode_plan",
        kind: CoreKind::Vector,
        num_tensors: 2,
        num_scalars: 4,
        tensor_args: &[
            arg("lens", In, I32, 1, MAX_REQUESTS),
            arg("plan", Out, I32, 1, 1),
        ],
        equal: &[],
        // KV heads, cores, page size, the partial's cost per item and per
        // token (two halves). Lengths are data: checked at run time.
        scalars: &[
            ScalarRule::AtMost(256),
            ScalarRule::AtMost(4096),
            ScalarRule::AtMost(65536),
            ScalarRule::Halves(1 << 16),
        ],
        extra: &[],
        entry: wsp_kernel_decode_plan,
    },
    KernelInfo {
        id: WspKernelId_WSP_KERNEL_SILU_MUL,
        name: "silu_mul",
        kind: CoreKind::Vector,
        num_tensors: 3,
        num_scalars: 0,
        tensor_args: &[
            arg("g", In, F32, 64, 64),
            arg("u", In, F32, 64, 64),
            arg("out", Out, F32, 64, 64),
        ],
        equal: &[
            Equal::new(1, Rows, 0, Rows),
            Equal::new(1, Cols, 0, Cols),
            Equal::new(2, Rows, 0, Rows),
            Equal::new(2, Cols, 0, Cols),
        ],
        scalars: &[],
        extra: &[],
        entry: wsp_kernel_silu_mul,
    },
    KernelInfo {
        id: WspKernelId_WSP_KERNEL_MOE_ROUTE,
        name: "moe_route",
        kind: CoreKind::Vector,
        num_tensors: 3,
        num_scalars: 1,
        tensor_args: &[
            arg("logits", In, F32, MAX_TOKENS, MAX_EXPERTS),
            arg("ids", Out, I32, MAX_TOKENS, MAX_EXPERTS),
            arg("weights", Out, F32, MAX_TOKENS, MAX_EXPERTS),
        ],
        equal: &[
            Equal::new(1, Rows, 0, Rows),
            Equal::new(2, Rows, 1, Rows),
            Equal::new(2, Cols, 1, Cols),
        ],
        scalars: &[ScalarRule::Threshold],
        extra: &[],
        entry: wsp_kernel_moe_route,
    },
    KernelInfo {
        id: WspKernelId_WSP_KERNEL_MOE_ALIGN,
        name: "moe_align",
        kind: CoreKind::Vector,
        num_tensors: 4,
        num_scalars: 1,
        // Ids are data: checked at run time, with the rows the padding needs.
        tensor_args: &[
            arg("ids", In, I32, MAX_ALIGN_TOKENS, MAX_EXPERTS),
            arg("tiles", Out, I32, 1, MAX_EXPERTS + 1),
            arg("rows", Out, I32, MAX_GATHER_SRC_ROWS, 1),
            arg("slot", Out, I32, MAX_ALIGN_TOKENS, MAX_EXPERTS),
        ],
        equal: &[Equal::new(3, Rows, 0, Rows), Equal::new(3, Cols, 0, Cols)],
        // The tile height M.
        scalars: &[ScalarRule::AtMost(64)],
        extra: &[],
        entry: wsp_kernel_moe_align,
    },
    KernelInfo {
        id: WspKernelId_WSP_KERNEL_GATHER_ROWS,
        name: "gather_rows",
        kind: CoreKind::Vector,
        num_tensors: 4,
        num_scalars: 0,
        // Indices are data: checked at run time against the src rows.
        tensor_args: &[
            arg("idx", In, I32, 64, 64),
            arg("w", In, F32, 64, 64),
            arg("src", In, F32, MAX_GATHER_SRC_ROWS, MAX_GATHER_COLS),
            arg("out", Out, F32, 64, MAX_GATHER_COLS),
        ],
        equal: &[
            Equal::new(1, Rows, 0, Rows),
            Equal::new(1, Cols, 0, Cols),
            Equal::new(3, Rows, 0, Rows),
            Equal::new(3, Cols, 2, Cols),
        ],
        scalars: &[],
        extra: &[],
        entry: wsp_kernel_gather_rows,
    },
    KernelInfo {
        id: WspKernelId_WSP_KERNEL_MATMUL,
        name: "matmul",
        kind: CoreKind::Cube,
        num_tensors: 3,
        num_scalars: 0,
        tensor_args: &[
            arg("a", In, F32, 64, 64),
            arg("b", In, F32, 64, 64),
            arg("c", Out, F32, 64, 64),
        ],
        equal: &[
            Equal::new(1, Rows, 0, Cols),
            Equal::new(2, Rows, 0, Rows),
            Equal::new(2, Cols, 1, Cols),
        ],
        scalars: &[],
        extra: &[],
        entry: wsp_kernel_matmul,
    },
    KernelInfo {
        id: WspKernelId_WSP_KERNEL_SQUARE,
        name: "square",
        kind: CoreKind::Vector,
        num_tensors: 2,
        num_scalars: 0,
        tensor_args: &[arg("a", In, F32, 64, 64), arg("c", Out, F32, 64, 64)],
        equal: &[Equal::new(1, Rows, 0, Rows), Equal::new(1, Cols, 0, Cols)],
        scalars: &[],
        extra: &[],
        entry: wsp_kernel_square,
    },
    KernelInfo {
        id: WspKernelId_WSP_KERNEL_COPY,
        name: "copy",
        kind: CoreKind::Vector,
        num_tensors: 2,
        num_scalars: 0,
        tensor_args: &[arg("x", In, F32, 64, 4096), arg("y", Out, F32, 64, 4096)],
        equal: &[],
        scalars: &[],
        extra: &[Extra::Elements {
            arg: 0,
            other: 1,
            max: 65536,
        }],
        entry: wsp_kernel_copy,
    },
    KernelInfo {
        id: WspKernelId_WSP_KERNEL_ROPE,
        name: "rope",
        kind: CoreKind::Vector,
        num_tensors: 3,
        num_scalars: 0,
        // x is y's n heads of D, as [n x D] or one row [1 x n*D].
        tensor_args: &[
            arg("x", In, F32, MAX_ROPE_HEADS, MAX_ROPE_HEADS * MAX_DIM),
            arg("cs", In, F32, 1, MAX_DIM),
            arg("y", Out, F32, MAX_ROPE_HEADS, MAX_DIM),
        ],
        equal: &[Equal::new(1, Cols, 2, Cols)],
        scalars: &[],
        extra: &[
            Extra::EvenCols { arg: 2 },
            Extra::Heads { arg: 0, heads: 2 },
        ],
        entry: wsp_kernel_rope,
    },
];

/// The kernel with this id, if registered. Ids run from 1 in the
/// registry's order, so the kernel is at `id - 1` (one load: the
/// dispatcher looks up every task's kernel); the search behind it keeps
/// the answer right should an id ever be skipped.
#[inline]
pub fn lookup(id: u32) -> Option<&'static KernelInfo> {
    match KERNELS.get(id.wrapping_sub(1) as usize) {
        Some(k) if k.id == id => Some(k),
        _ => KERNELS.iter().find(|k| k.id == id),
    }
}

/// Every registered kernel, in id order.
pub fn all() -> &'static [KernelInfo] {
    &KERNELS
}
