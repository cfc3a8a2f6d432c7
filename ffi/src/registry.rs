//! The kernel registry: what the runtime knows about each kernel.

use core::fmt;

use crate::bindings::{
    wsp_kernel_add, wsp_kernel_gemm_tile, wsp_kernel_rmsnorm, wsp_kernel_softmax, WspKernelArgs,
    WspKernelEntry, WspKernelId_WSP_KERNEL_ADD, WspKernelId_WSP_KERNEL_GEMM_TILE,
    WspKernelId_WSP_KERNEL_RMSNORM, WspKernelId_WSP_KERNEL_SOFTMAX,
};
use crate::contract::{Equal, ScalarRule};
use crate::WSP_KERNEL_REJECTED;

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
    pub name: &'static str,
    pub access: ArgAccess,
    /// Largest number of rows the kernel accepts.
    pub max_rows: u32,
    /// Largest number of columns the kernel accepts.
    pub max_cols: u32,
}

/// A registered kernel.
#[derive(Debug)]
pub struct KernelInfo {
    pub id: u32,
    pub name: &'static str,
    pub kind: CoreKind,
    pub num_tensors: u32,
    pub num_scalars: u32,
    pub tensor_args: &'static [ArgSpec],
    /// Shape rules between arguments (see [`KernelInfo::check`]).
    pub(crate) equal: &'static [Equal],
    /// One rule per scalar.
    pub(crate) scalars: &'static [ScalarRule],
    entry: unsafe extern "C" fn(*const WspKernelArgs) -> u64,
}

/// The kernel returned `WSP_KERNEL_REJECTED`: its arguments broke its contract.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelRejected {
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

const fn arg(name: &'static str, access: ArgAccess, max_rows: u32, max_cols: u32) -> ArgSpec {
    ArgSpec {
        name,
        access,
        max_rows,
        max_cols,
    }
}

use crate::contract::Dim::{Cols, Rows};
use ArgAccess::{In, InOut, Out};

static KERNELS: [KernelInfo; 4] = [
    KernelInfo {
        id: WspKernelId_WSP_KERNEL_ADD,
        name: "add",
        kind: CoreKind::Vector,
        num_tensors: 3,
        num_scalars: 0,
        tensor_args: &[
            arg("a", In, 64, 64),
            arg("b", In, 64, 64),
            arg("c", Out, 64, 64),
        ],
        equal: &[
            Equal::new(1, Rows, 0, Rows),
            Equal::new(1, Cols, 0, Cols),
            Equal::new(2, Rows, 0, Rows),
            Equal::new(2, Cols, 0, Cols),
        ],
        scalars: &[],
        entry: wsp_kernel_add,
    },
    KernelInfo {
        id: WspKernelId_WSP_KERNEL_GEMM_TILE,
        name: "gemm_tile",
        kind: CoreKind::Cube,
        num_tensors: 3,
        num_scalars: 0,
        tensor_args: &[
            arg("a", In, 64, 64),
            arg("b", In, 64, 64),
            arg("c", InOut, 64, 64),
        ],
        equal: &[
            Equal::new(1, Rows, 0, Cols),
            Equal::new(2, Rows, 0, Rows),
            Equal::new(2, Cols, 1, Cols),
        ],
        scalars: &[],
        entry: wsp_kernel_gemm_tile,
    },
    KernelInfo {
        id: WspKernelId_WSP_KERNEL_RMSNORM,
        name: "rmsnorm",
        kind: CoreKind::Vector,
        num_tensors: 3,
        num_scalars: 1,
        tensor_args: &[
            arg("x", In, 16, 1024),
            arg("g", In, 1, 1024),
            arg("y", Out, 16, 1024),
        ],
        equal: &[
            Equal::new(1, Cols, 0, Cols),
            Equal::new(2, Rows, 0, Rows),
            Equal::new(2, Cols, 0, Cols),
        ],
        scalars: &[ScalarRule::Eps],
        entry: wsp_kernel_rmsnorm,
    },
    KernelInfo {
        id: WspKernelId_WSP_KERNEL_SOFTMAX,
        name: "softmax",
        kind: CoreKind::Vector,
        num_tensors: 2,
        num_scalars: 0,
        tensor_args: &[arg("x", In, 16, 1024), arg("y", Out, 16, 1024)],
        equal: &[Equal::new(1, Rows, 0, Rows), Equal::new(1, Cols, 0, Cols)],
        scalars: &[],
        entry: wsp_kernel_softmax,
    },
];

/// The kernel with this id, if registered.
pub fn lookup(id: u32) -> Option<&'static KernelInfo> {
    KERNELS.iter().find(|k| k.id == id)
}

/// Every registered kernel, in id order.
pub fn all() -> &'static [KernelInfo] {
    &KERNELS
}
