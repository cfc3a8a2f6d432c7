//! Typed errors for descriptor tables: every error names where it is.

use core::fmt;

/// The part of a table an error points at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Section {
    /// The table header.
    Header,
    /// The tensors section.
    Tensors,
    /// The kernels section.
    Kernels,
    /// The tasks section.
    Tasks,
    /// The tensor-argument section.
    Args,
    /// The stream-ops section.
    StreamOps,
    /// The workload program; the index is the instruction's pc.
    Program,
}

impl Section {
    /// The section's name as in the header's fields.
    pub const fn name(self) -> &'static str {
        match self {
            Section::Header => "header",
            Section::Tensors => "tensors",
            Section::Kernels => "kernels",
            Section::Tasks => "tasks",
            Section::Args => "args",
            Section::StreamOps => "stream_ops",
            Section::Program => "program",
        }
    }
}

/// What is wrong with the field.
#[allow(missing_docs)] // Variant fields: see each variant's doc; their names say the rest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Problem {
    /// The magic bytes are not `PTOWSP\r\n`.
    BadMagic,
    /// An ABI version this runtime does not read.
    UnsupportedVersion { found: u32 },
    /// The bytes end before the table does.
    Truncated { needed: u64, available: u64 },
    /// Bytes follow the table: `given` bytes hold a table of `total_len`
    /// (refused where the bytes must be exactly one table, such as a table
    /// file: [`exact_table_len`](super::exact_table_len)).
    TrailingBytes { total_len: u64, given: u64 },
    /// The stored checksum does not match the bytes.
    ChecksumMismatch { stored: u32, computed: u32 },
    /// A value outside its allowed range `[min, max]`.
    OutOfRange { value: u64, min: u64, max: u64 },
    /// A value (an offset or size in bytes) that is not a multiple of
    /// `align`, the alignment it needs.
    Misaligned { value: u64, align: u64 },
    /// A tensor's size in bytes, from its shape and strides, does not fit
    /// in 64 bits.
    SizeOverflow,
    /// A tensor of `bytes` bytes at arena offset `offset` ends past the
    /// arena's `arena` bytes (named on `shape` when `bytes` alone exceeds
    /// the arena, else on `arena_offset`).
    PastArena { offset: u64, bytes: u64, arena: u64 },
    /// An arena tensor of `bytes` bytes at arena offset `offset` ends
    /// inside the heap ring, which starts at `heap_start` (the arena's last
    /// bytes hold the program's `HEAP`).
    IntoHeapRing {
        offset: u64,
        bytes: u64,
        heap_start: u64,
    },
    /// A kernel id the registry does not know, or not declared in the table.
    UnknownKernel { id: u32, declared: bool },
    /// A field disagrees with the kernel registry.
    RegistryMismatch { found: u32, expected: u32 },
    /// A region runs past its tensor in dimension `dim`.
    RegionOutside { dim: u32, end: u64, size: u32 },
    /// A region is not a 2-D tile (an outer dimension has extent other than 1).
    NotATile { dim: u32, extent: u32 },
    /// A dtype the ABI does not compute on.
    UnsupportedDtype { dtype: u32 },
    /// Two tensors share bytes of the arena.
    Aliases { other: u32 },
    /// The tensor arguments break the kernel's shape contract.
    KernelContract(wsp_ffi::ShapeError),
    /// A task writes a region that overlaps another of its own arguments
    /// (`other` is that argument's index in the args section).
    ArgsOverlap { other: u32 },
    /// The same kernel declared twice; `first` is the earlier entry.
    Duplicate { first: u32 },
    /// A section overlaps the header or another section.
    SectionOverlap { other: Section },
    /// Entries out of order: this one comes before entry `previous`'s place.
    Unsorted { previous: u32 },
    /// A wait on an event that no earlier stream op records.
    EventNotRecorded { event: u32 },
    /// An opcode the program machine does not have.
    BadOpcode { op: u8 },
    /// A register operand outside `0 .. MAX_REGS` (or `NO_REG` where a
    /// register is required, or a register where none is read).
    BadRegister { reg: u8 },
    /// The program's loops, jumps or calls are not well formed.
    Structure { why: &'static str },
    /// The program loads from a tensor that is neither an input nor
    /// written by any task: the data would never be there.
    DataNeverWritten { tensor: u32 },
    /// A `DISPATCH` whose schedule is not a policy and key the runtime
    /// knows (or, for taskset 0, not 0).
    BadSchedule { bits: u32 },
    /// A `SEND`, `CONSUME` or `CLOSE` on a channel no earlier `CHANNEL`
    /// declares.
    UndeclaredChannel { channel: u32 },
    /// A declared channel that no `SEND` of the program sends on: its
    /// consumers would wait forever.
    NoSender { channel: u32 },
    /// A `FREE` or `LOAD` names a tensor that is (for `LOAD`: is not
    /// allowed to be) a scratch tensor; `scratch` says which it is.
    Scratch { tensor: u32, scratch: bool },
    /// A scratch tensor in a table whose program declares no `HEAP`: its
    /// storage would have nowhere to come from.
    NoHeap,
    /// More scratch tensors than the runtime tracks.
    TooManyScratch { max: u32 },
    /// A `LOAD` from one more distinct tensor than the `max`
    /// (`MAX_DATA_TENSORS`) whose writes the expander tracks.
    TooManyDataTensors { max: u32 },
}

/// A descriptor table the runtime refuses, with the place and the reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TableError {
    /// The section of the faulty entry.
    pub section: Section,
    /// Entry index within the section (0 for the header).
    pub index: u32,
    /// Field name as in the ABI structs (`dtype`, `extent[2]`, ...).
    pub field: &'static str,
    /// What is wrong with it.
    pub problem: Problem,
}

impl TableError {
    pub(crate) const fn new(
        section: Section,
        index: u32,
        field: &'static str,
        problem: Problem,
    ) -> Self {
        TableError {
            section,
            index,
            field,
            problem,
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Problem::BadMagic => write!(f, "bad magic (not a pto-wsp descriptor table)"),
            Problem::UnsupportedVersion { found } => {
                write!(
                    f,
                    "ABI version {found} is not supported (this runtime reads version {})",
                    super::ABI_VERSION
                )
            }
            Problem::Truncated { needed, available } => {
                write!(f, "truncated: needs {needed} bytes, {available} available")
            }
            Problem::TrailingBytes { total_len, given } => write!(
                f,
                "the table is {total_len} bytes long, but {given} bytes were given: {} bytes follow it (a table file holds one table and nothing after it)",
                given - total_len
            ),
            Problem::ChecksumMismatch { stored, computed } => {
                write!(
                    f,
                    "checksum mismatch: stored {stored:#010x}, computed {computed:#010x}"
                )
            }
            Problem::OutOfRange { value, min, max } => {
                write!(f, "value {value} outside [{min}, {max}]")
            }
            Problem::Misaligned { value, align } => {
                write!(f, "value {value} is misaligned: it must be a multiple of {align}")
            }
            Problem::SizeOverflow => f.write_str(
                "the tensor's size in bytes (from its shape and strides) does not fit in 64 bits",
            ),
            Problem::PastArena {
                offset,
                bytes,
                arena,
            } if bytes > arena => write!(
                f,
                "the tensor is {bytes} bytes (at offset {offset}), larger than the whole arena of {arena} bytes"
            ),
            Problem::PastArena {
                offset,
                bytes,
                arena,
            } => write!(
                f,
                "the tensor's {bytes} bytes at offset {offset} end at {}, past the arena's {arena} bytes",
                offset as u128 + bytes as u128
            ),
            Problem::IntoHeapRing {
                offset,
                bytes,
                heap_start,
            } => write!(
                f,
                "the tensor's {bytes} bytes at offset {offset} end at {}, inside the heap ring, which starts at {heap_start} (no arena tensor may lie there)",
                offset as u128 + bytes as u128
            ),
            Problem::UnknownKernel {
                id,
                declared: false,
            } => write!(f, "unknown kernel id {id}"),
            Problem::UnknownKernel { id, declared: true } => {
                write!(f, "kernel id {id} is not declared in the kernels section")
            }
            Problem::RegistryMismatch { found, expected } => {
                write!(
                    f,
                    "{found} disagrees with the kernel registry, which says {expected}"
                )
            }
            Problem::RegionOutside { dim, end, size } => {
                write!(
                    f,
                    "region ends at {end} in dimension {dim}, past the tensor's size {size}"
                )
            }
            Problem::NotATile { dim, extent } => {
                write!(f, "region is not a 2-D tile: outer dimension {dim} has extent {extent} (must be 1)")
            }
            Problem::UnsupportedDtype { dtype } => {
                write!(f, "unsupported dtype {dtype} (the ABI has f32 = 1 and i32 = 2)")
            }
            Problem::Aliases { other } => write!(f, "shares arena bytes with tensor {other}"),
            Problem::KernelContract(e) => write!(f, "kernel contract: {e}"),
            Problem::ArgsOverlap { other } => {
                write!(
                    f,
                    "region overlaps argument {other} of the same task, and one of them is written"
                )
            }
            Problem::Duplicate { first } => write!(f, "duplicate of entry {first}"),
            Problem::SectionOverlap { other } => {
                write!(f, "section overlaps the {} section", other.name())
            }
            Problem::Unsorted { previous } => {
                write!(f, "out of order: sorts before entry {previous}, which comes earlier in the section")
            }
            Problem::EventNotRecorded { event } => {
                write!(
                    f,
                    "waits on event {event}, which no earlier stream op records"
                )
            }
            Problem::BadOpcode { op } => write!(f, "unknown opcode {op}"),
            Problem::BadRegister { reg } => write!(
                f,
                "register operand {reg:#04x} is not allowed here (registers are 0 to {}, {:#04x} = none)",
                super::program::MAX_REGS - 1,
                super::program::NO_REG
            ),
            Problem::Structure { why } => write!(f, "malformed program: {why}"),
            Problem::DataNeverWritten { tensor } => write!(
                f,
                "loads from tensor {tensor}, which no task writes and no INPUT declares"
            ),
            Problem::BadSchedule { bits } => write!(
                f,
                "schedule {bits:#010x} is not a known dispatch policy and key (taskset 0's must be 0: it is the run's)"
            ),
            Problem::UndeclaredChannel { channel } => write!(
                f,
                "channel {channel} is not declared (declare it with CHANNEL before its first use)"
            ),
            Problem::NoSender { channel } => write!(
                f,
                "nothing sends on channel {channel}: its consumers would wait forever (add a process that sends on it, or remove it)"
            ),
            Problem::Scratch { tensor, scratch: true } => write!(
                f,
                "tensor {tensor} is a scratch tensor, which LOAD cannot read (its storage moves; make it an arena tensor)"
            ),
            Problem::Scratch { tensor, scratch: false } => write!(
                f,
                "tensor {tensor} is not a scratch tensor: only scratch tensors are freed"
            ),
            Problem::NoHeap => f.write_str(
                "a scratch tensor needs heap ring bytes: the program must declare HEAP",
            ),
            Problem::TooManyScratch { max } => {
                write!(f, "more than {max} scratch tensors (MAX_SCRATCH)")
            }
            Problem::TooManyDataTensors { max } => write!(
                f,
                "a program LOADs from more than {max} distinct tensors (MAX_DATA_TENSORS)"
            ),
        }
    }
}

impl fmt::Display for TableError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid descriptor table: section `{}`, entry {}, field `{}`: {}",
            self.section.name(),
            self.index,
            self.field,
            self.problem
        )
    }
}
