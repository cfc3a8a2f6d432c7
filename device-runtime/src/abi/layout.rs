//! The byte layout of descriptor table ABI v1.
//!
//! A table is one little-endian byte string:
//!
//! ```text
//! +--------------------+  offset 0
//! | TableHeader (64 B) |  magic, version, lengths, checksum, section refs
//! +--------------------+
//! | TensorDesc  x n    |  64 B each
//! | KernelDesc  x n    |  16 B each
//! | TaskDesc    x n    |  48 B each
//! | TensorArg   x n    |  40 B each (tasks point into this pool)
//! +--------------------+  total_len
//! ```
//!
//! Sections may appear in any order at any offset after the header, but never
//! overlap the header or run past `total_len`. Every field is an unaligned
//! little-endian integer, so a table parses in place from any byte slice on any
//! host, with no copies and no unsafe casts. Every struct has explicit reserved
//! space instead of implicit padding (`IntoBytes` would reject padding).

use bitflags::bitflags;
use zerocopy::little_endian::{U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// `b"PTOWSP"` followed by `\r\n`: a text-mode transfer corrupts it visibly.
pub const MAGIC: [u8; 8] = *b"PTOWSP\r\n";
/// The ABI version this runtime reads and the host builder writes.
pub const ABI_VERSION: u32 = 1;
/// Size of [`TableHeader`] in bytes.
pub const HEADER_SIZE: usize = 64;
/// Largest tensor rank.
pub const MAX_RANK: usize = 4;
/// Largest number of scalars a task carries (the kernel ABI's capacity).
pub const MAX_SCALARS: usize = wsp_ffi::WSP_MAX_SCALARS as usize;
/// Largest number of tensor arguments a task carries (the kernel ABI's capacity).
pub const MAX_TENSOR_ARGS: usize = wsp_ffi::WSP_MAX_TENSOR_ARGS as usize;

/// Where a section lives: byte offset from the start of the table and entry count.
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct SectionRef {
    pub offset: U32,
    pub count: U32,
}

/// The table header (64 bytes).
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct TableHeader {
    /// [`MAGIC`].
    pub magic: [u8; 8],
    /// [`ABI_VERSION`].
    pub abi_version: U32,
    /// [`HEADER_SIZE`]; lets a reader skip a longer header of a later minor version.
    pub header_size: U32,
    /// Length of the whole table in bytes, header included.
    pub total_len: U32,
    /// CRC-32 (IEEE) of the whole table with this field read as zero.
    pub checksum: U32,
    /// Bytes of data arena the tensors need.
    pub arena_size: U64,
    pub tensors: SectionRef,
    pub kernels: SectionRef,
    pub tasks: SectionRef,
    pub args: SectionRef,
}

/// One tensor: a strided array in the data arena.
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct TensorDesc {
    /// A name for people (NUL-padded UTF-8); not interpreted by the runtime.
    pub name: [u8; 16],
    /// A `WSP_DTYPE_*` value; ABI v1 computes on f32 only.
    pub dtype: U32,
    /// Number of dimensions, 1 ..= [`MAX_RANK`].
    pub rank: U32,
    /// Sizes of the first `rank` dimensions; the rest are 0.
    pub shape: [U32; MAX_RANK],
    /// Element strides of the first `rank` dimensions; the innermost must be 1.
    pub strides: [U32; MAX_RANK],
    /// Byte offset of element 0 in the data arena; a multiple of the element size.
    pub arena_offset: U64,
}

/// One kernel the tasks of the table call.
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct KernelDesc {
    /// A `WSP_KERNEL_*` id known to the kernel registry.
    pub kernel_id: U32,
    /// 0 = cube, 1 = vector; must match the registry.
    pub core_kind: U32,
    /// Tensor arguments per call; must match the registry.
    pub num_tensors: U32,
    /// Scalar arguments per call; must match the registry.
    pub num_scalars: U32,
}

/// One task: one call of a kernel. Table order is program order.
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct TaskDesc {
    /// The kernel called; must be declared in the kernels section.
    pub kernel_id: U32,
    /// Index of the first argument in the args section.
    pub first_arg: U32,
    /// Number of tensor arguments (the kernel's `num_tensors`).
    pub num_args: U32,
    /// Number of scalars used (the kernel's `num_scalars`).
    pub num_scalars: U32,
    /// Raw 64-bit scalars; unused entries are 0.
    pub scalars: [U64; MAX_SCALARS],
}

bitflags! {
    /// Access mode of a tensor argument (the `access` field of [`TensorArg`]).
    /// The field is stored as a plain little-endian `u32` so the struct stays
    /// unaligned and endian-fixed; these flags give it meaning.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct Access: u32 {
        /// The kernel reads the region (`In`).
        const READ = 1;
        /// The kernel writes the region (`Out`; with `READ`, `InOut`).
        const WRITE = 2;
    }
}

/// A tensor argument of a task: a hyper-rectangular region of one tensor.
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct TensorArg {
    /// Index into the tensors section.
    pub tensor: U32,
    /// [`Access`] bits: 1 = In, 2 = Out, 3 = InOut.
    pub access: U32,
    /// First index of the region per dimension (0 beyond the rank).
    pub offset: [U32; MAX_RANK],
    /// Size of the region per dimension (1 beyond the rank). The region must be
    /// a 2-D tile: every dimension but the last two has extent 1.
    pub extent: [U32; MAX_RANK],
}

const _: () = {
    assert!(core::mem::size_of::<TableHeader>() == HEADER_SIZE);
    assert!(core::mem::size_of::<TensorDesc>() == 64);
    assert!(core::mem::size_of::<KernelDesc>() == 16);
    assert!(core::mem::size_of::<TaskDesc>() == 48);
    assert!(core::mem::size_of::<TensorArg>() == 40);
};
