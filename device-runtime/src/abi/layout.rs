//! The byte layout of descriptor table ABI v3.
//!
//! A table is one little-endian byte string:
//!
//! ```text
//! +--------------------+  offset 0
//! | TableHeader (80 B) |  magic, version, lengths, checksum, section refs
//! +--------------------+
//! | TensorDesc  x n    |  64 B each
//! | KernelDesc  x n    |  16 B each
//! | TaskDesc    x n    |  56 B each
//! | TensorArg   x n    |  40 B each (tasks point into this pool)
//! | StreamOp    x n    |  16 B each (event records and waits, in program order)
//! | Instr       x n    |  16 B each (the workload program)
//! +--------------------+  total_len
//! ```
//!
//! v2 added streams and events: [`TaskDesc::stream`] and the stream-ops
//! section. v3 added the workload program ([`Instr`]): loops and kernel
//! calls that the device expands into tasks as it runs, after the tasks of
//! the tasks section. A table of another version is refused with
//! `UnsupportedVersion`.
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
pub const ABI_VERSION: u32 = 3;
/// Size of [`TableHeader`] in bytes.
pub const HEADER_SIZE: usize = 80;
/// Largest tensor rank.
pub const MAX_RANK: usize = 4;
/// Largest number of scalars a task carries (the kernel ABI's capacity).
pub const MAX_SCALARS: usize = wsp_ffi::WSP_MAX_SCALARS as usize;
/// Largest number of tensor arguments a task carries (the kernel ABI's capacity).
pub const MAX_TENSOR_ARGS: usize = wsp_ffi::WSP_MAX_TENSOR_ARGS as usize;
/// Streams a table may use, numbered 1 ..= `MAX_STREAMS` (0 = no stream).
/// The orchestrator keeps a few words per stream pair for event waits.
pub const MAX_STREAMS: usize = 8;
/// Events a table may use, numbered 0 .. `MAX_EVENTS`.
pub const MAX_EVENTS: usize = 16;
/// [`StreamOp::op`]: record the event on the stream.
pub const STREAM_OP_RECORD: u32 = 1;
/// [`StreamOp::op`]: make the stream wait for the event.
pub const STREAM_OP_WAIT: u32 = 2;

/// Where a section lives: byte offset from the start of the table and entry count.
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct SectionRef {
    /// Byte offset of the section's first entry.
    pub offset: U32,
    /// Number of entries.
    pub count: U32,
}

/// The table header (80 bytes).
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
    /// The tensors section.
    pub tensors: SectionRef,
    /// The kernels section.
    pub kernels: SectionRef,
    /// The tasks section.
    pub tasks: SectionRef,
    /// The tensor-argument section.
    pub args: SectionRef,
    /// The stream-ops section.
    pub stream_ops: SectionRef,
    /// The workload program: [`Instr`]s, run after the tasks section.
    pub program: SectionRef,
}

/// One tensor: a strided array in the data arena.
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct TensorDesc {
    /// A name for people (NUL-padded UTF-8); not interpreted by the runtime.
    pub name: [u8; 16],
    /// A `WSP_DTYPE_*` value: f32 for kernel data, i32 for indices and
    /// lengths (the router's output, what a program's `LOAD` reads).
    pub dtype: U32,
    /// Number of dimensions, 1 ..= [`MAX_RANK`].
    pub rank: U32,
    /// Sizes of the first `rank` dimensions; the rest are 0.
    pub shape: [U32; MAX_RANK],
    /// Element strides of the first `rank` dimensions; the innermost must be 1.
    pub strides: [U32; MAX_RANK],
    /// Byte offset of element 0 in the data arena; a multiple of the element
    /// size. [`SCRATCH_OFFSET`] marks a *scratch* tensor, which has no arena
    /// bytes of its own: its storage comes from the heap ring (the program's
    /// `HEAP`) when its first writer is submitted and returns when its last
    /// reader retires (see [`crate::orch::scratch`]).
    pub arena_offset: U64,
}

/// [`TensorDesc::arena_offset`] of a scratch tensor: an intermediate whose
/// storage the runtime takes from the heap ring while the tensor is live.
pub const SCRATCH_OFFSET: u64 = u64::MAX;

impl TensorDesc {
    /// Whether it is a scratch tensor ([`SCRATCH_OFFSET`]).
    #[inline]
    pub fn is_scratch(&self) -> bool {
        self.arena_offset.get() == SCRATCH_OFFSET
    }
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
    /// The stream the task belongs to, 1 ..= [`MAX_STREAMS`], or 0 for none.
    /// A stream's tasks are issued to cores in table order (each after the
    /// one before it was issued) but may run at the same time.
    pub stream: U32,
    /// Must be 0.
    pub reserved: U32,
}

/// An event operation on a stream, applied in program order just before
/// task `before_task` is submitted (`before_task` = the number of tasks:
/// after the last one). The section is sorted by `before_task`; entries with
/// the same `before_task` apply in section order.
///
/// - Record ([`STREAM_OP_RECORD`]): the event stands for every task of
///   `stream` submitted so far; it has happened when all of them completed.
///   Recording an event again replaces what it stands for.
/// - Wait ([`STREAM_OP_WAIT`]): the next task of `stream` (and so, by issue
///   order, every later one) starts only after the event's latest record
///   before this point has happened. Waiting on an event never recorded
///   before is an error.
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct StreamOp {
    /// [`STREAM_OP_RECORD`] or [`STREAM_OP_WAIT`].
    pub op: U32,
    /// 1 ..= [`MAX_STREAMS`].
    pub stream: U32,
    /// 0 .. [`MAX_EVENTS`].
    pub event: U32,
    /// 0 ..= number of tasks.
    pub before_task: U32,
}

/// One instruction of the workload program (16 bytes). The program is a
/// structured, register-based loop language; `op` is one of the `OP_*`
/// constants of [`program`](super::program), which documents each one's
/// operands. Registers are numbered `0 .. MAX_REGS`; [`NO_REG`](super::program::NO_REG) reads as 0.
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct Instr {
    /// The opcode (`OP_*`).
    pub op: u8,
    /// The destination register, or a small operand (see the opcode).
    pub r: u8,
    /// Register operands or small immediates (see the opcode).
    pub x: [u8; 6],
    /// An immediate (see the opcode).
    pub imm: U32,
    /// A second immediate (see the opcode).
    pub imm2: U32,
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
    assert!(core::mem::size_of::<TaskDesc>() == 56);
    assert!(core::mem::size_of::<TensorArg>() == 40);
    assert!(core::mem::size_of::<StreamOp>() == 16);
    assert!(core::mem::size_of::<Instr>() == 16);
};
