//! Parsing and complete validation of a descriptor table.

use core::mem::size_of;

use zerocopy::FromBytes;

use super::checksum::table_checksum;
use super::error::{Problem, Section, TableError};
use super::layout::*;
use super::limits::{MAX_SCRATCH, MAX_TENSORS};
use super::program::ProgramInfo;
use super::region::{Region, TileView};

/// A descriptor table that passed validation, borrowed in place.
#[derive(Clone, Copy, Debug)]
pub struct Table<'a> {
    header: &'a TableHeader,
    tensors: &'a [TensorDesc],
    kernels: &'a [KernelDesc],
    tasks: &'a [TaskDesc],
    args: &'a [TensorArg],
    stream_ops: &'a [StreamOp],
    program: &'a [Instr],
    program_info: ProgramInfo,
    /// Scratch tensors (set by validation).
    scratch: u32,
    /// Bit `t` (for `t` below [`WRITES_TRACKED`]): some task argument or
    /// program `ARG` writes tensor `t` (set by validation).
    written: [u64; WRITES_TRACKED / 64],
}

/// Tensors whose writers validation records: a tensor below this index
/// that no task argument and no program `ARG` writes is *read-only* for
/// the run ([`Table::is_read_only`]); the orchestrator need not track its
/// accesses, as it has no writer to wait for or to hold back. Tensors at
/// or above it count as written (always correct, only slower). 1,024:
/// 128 bytes of [`Table`], far more tensors than a decode step declares.
pub const WRITES_TRACKED: usize = 1024;

/// Bytes per element of a dtype, or `None` for a dtype the ABI does not compute on.
pub const fn dtype_size(dtype: u32) -> Option<u64> {
    match dtype {
        wsp_ffi::DTYPE_F32 | wsp_ffi::DTYPE_I32 => Some(4),
        _ => None,
    }
}

/// The alignment, in bytes, of the start of a data arena. Validation puts
/// every tensor at an arena offset that is a multiple of its element size,
/// and every element size divides this, so a run whose arena starts at a
/// multiple of it gives kernels naturally aligned elements (the kernels'
/// contract); a run refuses any other arena.
pub const ARENA_ALIGN: u64 = 4;

// Every element size divides the arena's alignment.
const _: () = {
    let sizes = [
        dtype_size(wsp_ffi::DTYPE_F32),
        dtype_size(wsp_ffi::DTYPE_I32),
    ];
    let mut i = 0;
    while i < sizes.len() {
        match sizes[i] {
            Some(size) => assert!(ARENA_ALIGN.is_multiple_of(size)),
            None => panic!("a computed dtype has a size"),
        }
        i += 1;
    }
};

fn err(section: Section, index: usize, field: &'static str, problem: Problem) -> TableError {
    TableError::new(section, index as u32, field, problem)
}

fn header_err(field: &'static str, problem: Problem) -> TableError {
    err(Section::Header, 0, field, problem)
}

/// Reads just enough of a header to tell the table's total length: for a loader
/// that finds a table at an address and must size the slice before parsing.
pub fn table_len(header_bytes: &[u8]) -> Result<usize, TableError> {
    let truncated = |field| {
        header_err(
            field,
            Problem::Truncated {
                needed: HEADER_SIZE as u64,
                available: header_bytes.len() as u64,
            },
        )
    };
    // Magic and version first: a table of another version may have a
    // shorter header, and should be named as such rather than as truncated.
    let Some(magic) = header_bytes.get(..8) else {
        return Err(truncated("magic"));
    };
    if magic != MAGIC {
        return Err(header_err("magic", Problem::BadMagic));
    }
    let Some(version) = header_bytes.get(8..12) else {
        return Err(truncated("abi_version"));
    };
    let version = u32::from_le_bytes([version[0], version[1], version[2], version[3]]);
    if version != ABI_VERSION {
        return Err(header_err(
            "abi_version",
            Problem::UnsupportedVersion { found: version },
        ));
    }
    let (header, _) =
        TableHeader::ref_from_prefix(header_bytes).map_err(|_| truncated("header_size"))?;
    if header.header_size.get() as usize != HEADER_SIZE {
        let value = header.header_size.get() as u64;
        return Err(header_err(
            "header_size",
            Problem::OutOfRange {
                value,
                min: HEADER_SIZE as u64,
                max: HEADER_SIZE as u64,
            },
        ));
    }
    let total = header.total_len.get() as usize;
    if total < HEADER_SIZE {
        let value = total as u64;
        return Err(header_err(
            "total_len",
            Problem::OutOfRange {
                value,
                min: HEADER_SIZE as u64,
                max: u32::MAX as u64,
            },
        ));
    }
    Ok(total)
}

/// The length of a table that must be all of `bytes` (a table file, whose
/// length its reader knows): the header's `total_len`, refused when the
/// bytes end before it ([`Problem::Truncated`]) or go on past it
/// ([`Problem::TrailingBytes`]: a file with something appended).
/// [`Table::parse`] reads the first `total_len` bytes and ignores the rest,
/// as a loader may hand it a fixed window or a padded buffer.
pub fn exact_table_len(bytes: &[u8]) -> Result<usize, TableError> {
    let total = table_len(bytes)?;
    let (total_len, given) = (total as u64, bytes.len() as u64);
    if given < total_len {
        let problem = Problem::Truncated {
            needed: total_len,
            available: given,
        };
        return Err(header_err("total_len", problem));
    }
    if given > total_len {
        let problem = Problem::TrailingBytes { total_len, given };
        return Err(header_err("total_len", problem));
    }
    Ok(total)
}

/// Bounds of one section, checked against the table length.
fn section<'a, T: FromBytes + zerocopy::KnownLayout + zerocopy::Immutable>(
    bytes: &'a [u8],
    field: &'static str,
    sref: &SectionRef,
) -> Result<(&'a [T], core::ops::Range<u64>), TableError> {
    let offset = sref.offset.get() as u64;
    let len = sref.count.get() as u64 * size_of::<T>() as u64;
    let total = bytes.len() as u64;
    if sref.count.get() > 0 && offset < HEADER_SIZE as u64 {
        return Err(header_err(
            field,
            Problem::SectionOverlap {
                other: Section::Header,
            },
        ));
    }
    if offset + len > total {
        return Err(header_err(
            field,
            Problem::Truncated {
                needed: offset + len,
                available: total,
            },
        ));
    }
    let raw = &bytes[offset as usize..(offset + len) as usize];
    let entries = <[T]>::ref_from_bytes(raw).expect("unaligned types of exact length always parse");
    Ok((entries, offset..offset + len))
}

impl<'a> Table<'a> {
    /// Parses and validates a whole table. `bytes` may be longer than the
    /// table (a loader's fixed window, the padded buffer of a launch); only
    /// `total_len` bytes are read. Where the bytes must be exactly one
    /// table (a file), check [`exact_table_len`] first.
    pub fn parse(bytes: &'a [u8]) -> Result<Table<'a>, TableError> {
        let total = table_len(bytes)?;
        if bytes.len() < total {
            let problem = Problem::Truncated {
                needed: total as u64,
                available: bytes.len() as u64,
            };
            return Err(header_err("total_len", problem));
        }
        let bytes = &bytes[..total];
        let (header, _) = TableHeader::ref_from_prefix(bytes).expect("length checked by table_len");
        let computed = table_checksum(bytes);
        if computed != header.checksum.get() {
            let problem = Problem::ChecksumMismatch {
                stored: header.checksum.get(),
                computed,
            };
            return Err(header_err("checksum", problem));
        }
        let (tensors, r0) = section::<TensorDesc>(bytes, "tensors", &header.tensors)?;
        if tensors.len() > MAX_TENSORS {
            let problem = Problem::OutOfRange {
                value: tensors.len() as u64,
                min: 0,
                max: MAX_TENSORS as u64,
            };
            return Err(header_err("tensors", problem));
        }
        let (kernels, r1) = section::<KernelDesc>(bytes, "kernels", &header.kernels)?;
        let (tasks, r2) = section::<TaskDesc>(bytes, "tasks", &header.tasks)?;
        let (args, r3) = section::<TensorArg>(bytes, "args", &header.args)?;
        let (stream_ops, r4) = section::<StreamOp>(bytes, "stream_ops", &header.stream_ops)?;
        let (program, r5) = section::<Instr>(bytes, "program", &header.program)?;
        let ranges = [
            (Section::Tensors, r0),
            (Section::Kernels, r1),
            (Section::Tasks, r2),
            (Section::Args, r3),
            (Section::StreamOps, r4),
            (Section::Program, r5),
        ];
        for (i, (a, ra)) in ranges.iter().enumerate() {
            for (b, rb) in &ranges[i + 1..] {
                if !ra.is_empty() && !rb.is_empty() && ra.start < rb.end && rb.start < ra.end {
                    return Err(header_err(b.name(), Problem::SectionOverlap { other: *a }));
                }
            }
        }
        let mut table = Table {
            header,
            tensors,
            kernels,
            tasks,
            args,
            stream_ops,
            program,
            program_info: ProgramInfo::default(),
            scratch: 0,
            written: [0; WRITES_TRACKED / 64],
        };
        table.validate_tensors()?;
        table.validate_kernels()?;
        let args_written = table.validate_tasks()?;
        table.validate_stream_ops()?;
        table.program_info = super::program::validate(
            program,
            tensors,
            |id| kernels.iter().any(|k| k.kernel_id.get() == id),
            |t| {
                args.iter().any(|a| {
                    a.tensor.get() == t
                        && Access::from_bits_truncate(a.access.get()).contains(Access::WRITE)
                })
            },
        )?;
        table.scratch = table.validate_scratch()?;
        table.written = table.writes(args_written);
        Ok(table)
    }

    /// Which tensors below [`WRITES_TRACKED`] some task argument or program
    /// `ARG` writes (every entry of the arguments section counts, used by
    /// a task or not, and every `ARG` of the program, reached or not).
    /// `args`: those the arguments section writes, when validating the
    /// tasks found them already.
    fn writes(&self, args: Option<[u64; WRITES_TRACKED / 64]>) -> [u64; WRITES_TRACKED / 64] {
        let mut written = args.unwrap_or([0; WRITES_TRACKED / 64]);
        let mut mark = |tensor: u32, access: u32| {
            let t = tensor as usize;
            if t < WRITES_TRACKED && Access::from_bits_truncate(access).contains(Access::WRITE) {
                written[t / 64] |= 1 << (t % 64);
            }
        };
        if args.is_none() {
            for a in self.args {
                mark(a.tensor.get(), a.access.get());
            }
        }
        for ins in self.program {
            if ins.op == super::program::OP_ARG {
                mark(ins.imm.get(), ins.r as u32);
            }
        }
        written
    }

    /// Whether no task of a run of this table writes `tensor` (found by
    /// validation; see [`WRITES_TRACKED`]): its contents are those the run
    /// starts with (weights, inputs), so no task's access to it orders
    /// any other task's.
    #[inline]
    pub fn is_read_only(&self, tensor: u32) -> bool {
        let t = tensor as usize;
        t < WRITES_TRACKED && self.written[t / 64] & (1 << (t % 64)) == 0
    }

    /// Scratch tensors: at most [`MAX_SCRATCH`], only with a `HEAP`, each
    /// no larger than the heap ring; the heap ring (the arena's last `HEAP`
    /// bytes) holds no arena tensor.
    fn validate_scratch(&self) -> Result<u32, TableError> {
        let heap = self.program_info.heap as u64;
        let arena = self.arena_size();
        let heap_pc = || {
            self.program
                .iter()
                .position(|p| p.op == super::program::OP_HEAP)
                .unwrap_or(0)
        };
        if heap > arena {
            let problem = Problem::OutOfRange {
                value: heap,
                min: 0,
                max: arena,
            };
            return Err(err(Section::Program, heap_pc(), "imm", problem));
        }
        if !(arena - heap).is_multiple_of(ARENA_ALIGN) {
            // The ring's blocks are 64-byte aligned from its start, which
            // must give kernels aligned elements; `heap` is a multiple of
            // 64 (validated with the program), so the arena's size is what
            // is misaligned.
            let problem = Problem::Misaligned {
                value: arena,
                align: ARENA_ALIGN,
            };
            return Err(err(Section::Header, 0, "arena_size", problem));
        }
        let mut count = 0;
        for (i, t) in self.tensors.iter().enumerate() {
            let e = |field, problem| err(Section::Tensors, i, field, problem);
            if !t.is_scratch() {
                // Validated to fit the arena (`None` cannot happen).
                let bytes = Self::tensor_bytes(t).unwrap_or(0..0);
                if heap > 0 && bytes.end > arena - heap {
                    let problem = Problem::IntoHeapRing {
                        offset: bytes.start,
                        bytes: bytes.end - bytes.start,
                        heap_start: arena - heap,
                    };
                    return Err(e("arena_offset", problem));
                }
                continue;
            }
            count += 1;
            if count > MAX_SCRATCH {
                let problem = Problem::TooManyScratch {
                    max: MAX_SCRATCH as u32,
                };
                return Err(e("arena_offset", problem));
            }
            if heap == 0 {
                return Err(e("arena_offset", Problem::NoHeap));
            }
            let len = Self::tensor_len(t).unwrap_or(u64::MAX);
            if len > heap {
                let problem = Problem::OutOfRange {
                    value: len,
                    min: 0,
                    max: heap,
                };
                return Err(e("shape", problem));
            }
        }
        Ok(count as u32)
    }

    /// How many scratch tensors it declares.
    pub fn scratch_count(&self) -> u32 {
        self.scratch
    }

    /// The heap ring: where it starts in the arena and its bytes (0 if the
    /// program declares no `HEAP`).
    pub fn heap(&self) -> (u64, u64) {
        let heap = self.program_info.heap as u64;
        (self.arena_size() - heap, heap)
    }

    /// Bytes of data arena the tensors need.
    pub fn arena_size(&self) -> u64 {
        self.header.arena_size.get()
    }
    /// The table's length in bytes.
    pub fn total_len(&self) -> usize {
        self.header.total_len.get() as usize
    }
    /// The header.
    pub fn header(&self) -> &'a TableHeader {
        self.header
    }
    /// The tensors section.
    pub fn tensors(&self) -> &'a [TensorDesc] {
        self.tensors
    }
    /// The kernels section.
    pub fn kernels(&self) -> &'a [KernelDesc] {
        self.kernels
    }
    /// The tasks section.
    pub fn tasks(&self) -> &'a [TaskDesc] {
        self.tasks
    }
    /// Event records and waits, sorted by the task they precede.
    pub fn stream_ops(&self) -> &'a [StreamOp] {
        self.stream_ops
    }
    /// The workload program, run after the tasks section.
    pub fn program(&self) -> &'a [Instr] {
        self.program
    }
    /// What validation learned about the program.
    pub fn program_info(&self) -> &ProgramInfo {
        &self.program_info
    }
    /// The tensor arguments of `task` (validated to lie inside the args section).
    pub fn task_args(&self, task: &TaskDesc) -> &'a [TensorArg] {
        let first = task.first_arg.get() as usize;
        &self.args[first..first + task.num_args.get() as usize]
    }

    /// Bytes from a tensor's element 0 to one past its last element (what a
    /// scratch tensor takes from the heap ring); `None` if it does not fit
    /// in 64 bits.
    pub fn tensor_len(tensor: &TensorDesc) -> Option<u64> {
        let elem = dtype_size(tensor.dtype.get())?;
        let rank = tensor.rank.get() as usize;
        let mut last = 0u64;
        for d in 0..rank.min(MAX_RANK) {
            let span =
                (tensor.shape[d].get() as u64).saturating_sub(1) * tensor.strides[d].get() as u64;
            last = last.checked_add(span)?;
        }
        last.checked_add(1)?.checked_mul(elem)
    }

    /// Byte range of a tensor's elements in the arena (first to one past last);
    /// `None` if it does not fit in 64 bits (or it is a scratch tensor,
    /// which has no arena bytes).
    pub fn tensor_bytes(tensor: &TensorDesc) -> Option<core::ops::Range<u64>> {
        let elem = dtype_size(tensor.dtype.get())?;
        let rank = tensor.rank.get() as usize;
        let mut last = 0u64;
        for d in 0..rank.min(MAX_RANK) {
            // Each product is below 2^64 (two u32 factors); the sum and the
            // size in bytes are checked.
            let span =
                (tensor.shape[d].get() as u64).saturating_sub(1) * tensor.strides[d].get() as u64;
            last = last.checked_add(span)?;
        }
        let len = last.checked_add(1)?.checked_mul(elem)?;
        let start = tensor.arena_offset.get();
        Some(start..start.checked_add(len)?)
    }

    fn validate_tensors(&self) -> Result<(), TableError> {
        let arena = self.arena_size();
        for (i, t) in self.tensors.iter().enumerate() {
            let e = |field, problem| err(Section::Tensors, i, field, problem);
            let dtype = t.dtype.get();
            let elem = dtype_size(dtype).ok_or(e("dtype", Problem::UnsupportedDtype { dtype }))?;
            let rank = t.rank.get() as usize;
            if !(1..=MAX_RANK).contains(&rank) {
                return Err(e(
                    "rank",
                    Problem::OutOfRange {
                        value: rank as u64,
                        min: 1,
                        max: MAX_RANK as u64,
                    },
                ));
            }
            const SHAPE: [&str; MAX_RANK] = ["shape[0]", "shape[1]", "shape[2]", "shape[3]"];
            const STRIDES: [&str; MAX_RANK] =
                ["strides[0]", "strides[1]", "strides[2]", "strides[3]"];
            for d in 0..MAX_RANK {
                let (size, stride) = (t.shape[d].get() as u64, t.strides[d].get() as u64);
                if d < rank && size == 0 {
                    return Err(e(
                        SHAPE[d],
                        Problem::OutOfRange {
                            value: 0,
                            min: 1,
                            max: u32::MAX as u64,
                        },
                    ));
                }
                if d >= rank && size != 0 {
                    return Err(e(
                        SHAPE[d],
                        Problem::OutOfRange {
                            value: size,
                            min: 0,
                            max: 0,
                        },
                    ));
                }
                if d >= rank && stride != 0 {
                    return Err(e(
                        STRIDES[d],
                        Problem::OutOfRange {
                            value: stride,
                            min: 0,
                            max: 0,
                        },
                    ));
                }
            }
            // Row-major without self-overlap: innermost stride 1, each outer
            // stride covers the whole inner block. Distinct indices then name
            // distinct bytes, which dependency inference relies on.
            if t.strides[rank - 1].get() != 1 {
                let value = t.strides[rank - 1].get() as u64;
                return Err(e(
                    STRIDES[rank - 1],
                    Problem::OutOfRange {
                        value,
                        min: 1,
                        max: 1,
                    },
                ));
            }
            for d in (0..rank - 1).rev() {
                let inner = t.strides[d + 1].get() as u64 * t.shape[d + 1].get() as u64;
                let stride = t.strides[d].get() as u64;
                if stride < inner {
                    return Err(e(
                        STRIDES[d],
                        Problem::OutOfRange {
                            value: stride,
                            min: inner,
                            max: u32::MAX as u64,
                        },
                    ));
                }
            }
            // The size first: a shape whose bytes overflow, or exceed the
            // whole arena, is the shape's fault whatever the offset.
            let len = Self::tensor_len(t).ok_or(e("shape", Problem::SizeOverflow))?;
            if t.is_scratch() {
                // No arena bytes: its size is checked against the heap
                // ring once the program's HEAP is known.
                continue;
            }
            let offset = t.arena_offset.get();
            if !offset.is_multiple_of(elem) {
                return Err(e(
                    "arena_offset",
                    Problem::Misaligned {
                        value: offset,
                        align: elem,
                    },
                ));
            }
            let past = Problem::PastArena {
                offset,
                bytes: len,
                arena,
            };
            if len > arena {
                return Err(e("shape", past));
            }
            // `arena - len` does not underflow, and `offset + len` below
            // does not overflow once `offset` is at most it.
            if offset > arena - len {
                return Err(e("arena_offset", past));
            }
            let bytes = offset..offset + len;
            for (j, other) in self.tensors[..i].iter().enumerate() {
                if other.is_scratch() {
                    continue;
                }
                let o = Self::tensor_bytes(other).expect("earlier tensors validated");
                if bytes.start < o.end && o.start < bytes.end {
                    return Err(e("arena_offset", Problem::Aliases { other: j as u32 }));
                }
            }
        }
        Ok(())
    }

    fn validate_kernels(&self) -> Result<(), TableError> {
        for (i, k) in self.kernels.iter().enumerate() {
            let e = |field, problem| err(Section::Kernels, i, field, problem);
            let id = k.kernel_id.get();
            let info = wsp_ffi::lookup(id).ok_or(e(
                "kernel_id",
                Problem::UnknownKernel {
                    id,
                    declared: false,
                },
            ))?;
            let checks = [
                ("core_kind", k.core_kind.get(), info.kind as u32),
                ("num_tensors", k.num_tensors.get(), info.num_tensors),
                ("num_scalars", k.num_scalars.get(), info.num_scalars),
            ];
            for (field, found, expected) in checks {
                if found != expected {
                    return Err(e(field, Problem::RegistryMismatch { found, expected }));
                }
            }
            if let Some(first) = self.kernels[..i]
                .iter()
                .position(|p| p.kernel_id.get() == id)
            {
                return Err(e(
                    "kernel_id",
                    Problem::Duplicate {
                        first: first as u32,
                    },
                ));
            }
        }
        Ok(())
    }

    /// Validates every task and its arguments. When the tasks' arguments
    /// are the whole arguments section, in order (as the table builder
    /// lays them out), also returns the tensors they write (see
    /// [`Table::writes`]), found on the way: one pass over the arguments
    /// instead of two.
    fn validate_tasks(&self) -> Result<Option<[u64; WRITES_TRACKED / 64]>, TableError> {
        let nargs = self.args.len() as u64;
        let mut written = [0u64; WRITES_TRACKED / 64];
        // The arguments the tasks so far used, if they are all those
        // before it, in order.
        let mut in_order = Some(0u64);
        // Neighbouring tasks mostly call one kernel, on tiles of one shape
        // with the same scalars: the kernel is looked up again, and its
        // contract checked again (a function of the kernel, the shapes and
        // the scalars alone), only when they change.
        let mut kernel: Option<(u32, &'static wsp_ffi::KernelInfo)> = None;
        // What the last contract check passed: its kernel, and its shapes
        // and scalars as plain words (compared as a whole; unused ones 0).
        let mut passed: Option<u32> = None;
        let mut passed_words = [0u32; 3 * MAX_TENSOR_ARGS + 2 * MAX_SCALARS];
        for (i, task) in self.tasks.iter().enumerate() {
            let e = |field, problem| err(Section::Tasks, i, field, problem);
            let id = task.kernel_id.get();
            let info = match kernel {
                Some((last, info)) if last == id => info,
                _ => {
                    if !self.kernels.iter().any(|k| k.kernel_id.get() == id) {
                        let declared = wsp_ffi::lookup(id).is_some();
                        return Err(e("kernel_id", Problem::UnknownKernel { id, declared }));
                    }
                    let info = wsp_ffi::lookup(id)
                        .expect("declared kernels are validated against the registry");
                    kernel = Some((id, info));
                    info
                }
            };
            let (first, count) = (task.first_arg.get() as u64, task.num_args.get() as u64);
            if count != info.num_tensors as u64 {
                let n = info.num_tensors as u64;
                return Err(e(
                    "num_args",
                    Problem::OutOfRange {
                        value: count,
                        min: n,
                        max: n,
                    },
                ));
            }
            if first + count > nargs {
                let problem = Problem::OutOfRange {
                    value: first,
                    min: 0,
                    max: nargs.saturating_sub(count),
                };
                return Err(e("first_arg", problem));
            }
            let stream = task.stream.get() as u64;
            if stream > MAX_STREAMS as u64 {
                let problem = Problem::OutOfRange {
                    value: stream,
                    min: 0,
                    max: MAX_STREAMS as u64,
                };
                return Err(e("stream", problem));
            }
            if task.reserved.get() != 0 {
                let problem = Problem::OutOfRange {
                    value: task.reserved.get() as u64,
                    min: 0,
                    max: 0,
                };
                return Err(e("reserved", problem));
            }
            let nscalars = task.num_scalars.get() as u64;
            if nscalars != info.num_scalars as u64 {
                let n = info.num_scalars as u64;
                return Err(e(
                    "num_scalars",
                    Problem::OutOfRange {
                        value: nscalars,
                        min: n,
                        max: n,
                    },
                ));
            }
            let mut shapes = [wsp_ffi::TileShape {
                rows: 0,
                cols: 0,
                dtype: 0,
            }; MAX_TENSOR_ARGS];
            for (k, arg) in self.task_args(task).iter().enumerate() {
                let spec_access = info.tensor_args[k].access as u32;
                shapes[k] = self.validate_arg(first as usize + k, arg, spec_access)?;
                // Valid: the registry's access.
                let t = arg.tensor.get() as usize;
                if t < WRITES_TRACKED && spec_access & Access::WRITE.bits() != 0 {
                    written[t / 64] |= 1 << (t % 64);
                }
            }
            in_order = in_order.filter(|&n| n == first).map(|n| n + count);
            self.check_disjoint_writes(first as usize, self.task_args(task))?;
            // Only the kernel's scalars: the rest of the record is not the
            // contract's (and the counts are the kernel's, checked above).
            let nscalars = (nscalars as usize).min(MAX_SCALARS);
            let mut scalars = [0u64; MAX_SCALARS];
            for (s, v) in scalars[..nscalars].iter_mut().zip(task.scalars.iter()) {
                *s = v.get();
            }
            let mut words = [0u32; 3 * MAX_TENSOR_ARGS + 2 * MAX_SCALARS];
            for (w, shape) in words.chunks_exact_mut(3).zip(&shapes) {
                w.copy_from_slice(&[shape.rows, shape.cols, shape.dtype]);
            }
            for (w, s) in words[3 * MAX_TENSOR_ARGS..]
                .chunks_exact_mut(2)
                .zip(scalars)
            {
                w.copy_from_slice(&[s as u32, (s >> 32) as u32]);
            }
            if passed != Some(id) || words != passed_words {
                info.check(&shapes[..count as usize], &scalars[..nscalars])
                    .map_err(|c| e("first_arg", Problem::KernelContract(c)))?;
                (passed, passed_words) = (Some(id), words);
            }
        }
        Ok((in_order == Some(nargs)).then_some(written))
    }

    /// Stream ops name existing streams and events, are sorted by the task
    /// they precede, and wait only on events recorded before them.
    fn validate_stream_ops(&self) -> Result<(), TableError> {
        let mut recorded = 0u64;
        let mut previous = 0;
        let range = |value: u32, min: u64, max: u64| Problem::OutOfRange {
            value: value as u64,
            min,
            max,
        };
        for (i, op) in self.stream_ops.iter().enumerate() {
            let e = |field, problem| err(Section::StreamOps, i, field, problem);
            let (kind, stream, event) = (op.op.get(), op.stream.get(), op.event.get());
            let before = op.before_task.get();
            if kind != STREAM_OP_RECORD && kind != STREAM_OP_WAIT {
                return Err(e("op", range(kind, 1, 2)));
            }
            if stream == 0 || stream as usize > MAX_STREAMS {
                return Err(e("stream", range(stream, 1, MAX_STREAMS as u64)));
            }
            if event as usize >= MAX_EVENTS {
                return Err(e("event", range(event, 0, MAX_EVENTS as u64 - 1)));
            }
            if before as usize > self.tasks.len() {
                return Err(e("before_task", range(before, 0, self.tasks.len() as u64)));
            }
            if i > 0 && before < previous {
                let problem = Problem::Unsorted {
                    previous: i as u32 - 1,
                };
                return Err(e("before_task", problem));
            }
            previous = before;
            if kind == STREAM_OP_RECORD {
                recorded |= 1 << event;
            } else if recorded & (1 << event) == 0 {
                return Err(e("event", Problem::EventNotRecorded { event }));
            }
        }
        Ok(())
    }

    /// A kernel's output must not overlap its other arguments: the result
    /// would depend on the kernel's loop order.
    fn check_disjoint_writes(&self, first: usize, args: &[TensorArg]) -> Result<(), TableError> {
        let writes =
            |a: &TensorArg| Access::from_bits_retain(a.access.get()).contains(Access::WRITE);
        for (k, a) in args.iter().enumerate() {
            for (l, b) in args.iter().enumerate().skip(k + 1) {
                if a.tensor == b.tensor
                    && (writes(a) || writes(b))
                    && Region::of(a).overlaps(&Region::of(b))
                {
                    let problem = Problem::ArgsOverlap {
                        other: (first + k) as u32,
                    };
                    return Err(err(Section::Args, first + l, "offset", problem));
                }
            }
        }
        Ok(())
    }

    fn validate_arg(
        &self,
        index: usize,
        arg: &TensorArg,
        expected_access: u32,
    ) -> Result<wsp_ffi::TileShape, TableError> {
        let e = |field, problem| err(Section::Args, index, field, problem);
        let t = arg.tensor.get() as usize;
        let tensor = self.tensors.get(t).ok_or(e(
            "tensor",
            Problem::OutOfRange {
                value: t as u64,
                min: 0,
                max: (self.tensors.len() as u64).saturating_sub(1),
            },
        ))?;
        let access = arg.access.get();
        // The registry's access is a valid one: an argument that has it
        // needs no other test.
        if access != expected_access && Access::from_bits(access).is_none_or(|a| a.is_empty()) {
            return Err(e(
                "access",
                Problem::OutOfRange {
                    value: access as u64,
                    min: 1,
                    max: 3,
                },
            ));
        }
        if access != expected_access {
            return Err(e(
                "access",
                Problem::RegistryMismatch {
                    found: access,
                    expected: expected_access,
                },
            ));
        }
        let region = Region::of(arg);
        let shape = check_region(tensor, &region).map_err(|(field, problem)| e(field, problem))?;
        Ok(shape)
    }
}

/// Checks that `region` is a 2-D tile inside `tensor` (a tensor of a
/// validated table; one whose rank is not 1 ..= [`MAX_RANK`] gets an error
/// naming `rank`), and returns the tile's shape; on failure names the
/// offending field of a [`TensorArg`].
///
/// Every task argument of a table and every argument an expanded program
/// call names goes through here, so the common case, a valid tile, is one
/// pass over the dimensions without a branch per test: each test is a
/// signed difference that is negative exactly when it fails, and one OR
/// carries every sign. Only a region that fails some test goes through
/// `region_problem`, which tests one condition after the other and
/// names the first that fails.
#[inline]
pub fn check_region(
    tensor: &TensorDesc,
    region: &Region,
) -> Result<wsp_ffi::TileShape, (&'static str, Problem)> {
    let rank = tensor.rank.get() as usize;
    let mut signs: i64 = if (1..=MAX_RANK).contains(&rank) {
        0
    } else {
        -1
    };
    for d in 0..MAX_RANK {
        // Below 2^32 each: no difference overflows.
        let (off, ext) = (region.offset[d] as i64, region.extent[d] as i64);
        // Beyond the rank a dimension is one element long (offset 0,
        // extent 1), and before a tile's rows and columns the extent is 1.
        let size = if d < rank {
            tensor.shape[d].get() as i64
        } else {
            1
        };
        let most = if d + 2 < rank { 1 } else { size };
        // Not empty, inside the dimension, at most `most` long.
        signs |= (ext - 1) | (size - off - ext) | (most - ext);
    }
    if signs < 0 {
        return region_problem(tensor, region);
    }
    let cols = region.extent[rank - 1];
    let rows = if rank >= 2 {
        region.extent[rank - 2]
    } else {
        1
    };
    Ok(wsp_ffi::TileShape {
        rows,
        cols,
        dtype: tensor.dtype.get(),
    })
}

/// [`check_region`] one test after the other: the first that fails names
/// the field (for a region that passes them all, its shape). Out of line:
/// only a bad region comes here.
#[cold]
#[inline(never)]
fn region_problem(
    tensor: &TensorDesc,
    region: &Region,
) -> Result<wsp_ffi::TileShape, (&'static str, Problem)> {
    let e = |field, problem| (field, problem);
    const OFFSET: [&str; MAX_RANK] = ["offset[0]", "offset[1]", "offset[2]", "offset[3]"];
    const EXTENT: [&str; MAX_RANK] = ["extent[0]", "extent[1]", "extent[2]", "extent[3]"];
    let rank = tensor.rank.get() as usize;
    if !(1..=MAX_RANK).contains(&rank) {
        // Not a validated tensor: no region of it is a tile.
        let problem = Problem::OutOfRange {
            value: rank as u64,
            min: 1,
            max: MAX_RANK as u64,
        };
        return Err(e("rank", problem));
    }
    for d in 0..MAX_RANK {
        let (off, ext) = (region.offset[d], region.extent[d]);
        if d >= rank {
            if off != 0 {
                return Err(e(
                    OFFSET[d],
                    Problem::OutOfRange {
                        value: off as u64,
                        min: 0,
                        max: 0,
                    },
                ));
            }
            if ext != 1 {
                return Err(e(
                    EXTENT[d],
                    Problem::OutOfRange {
                        value: ext as u64,
                        min: 1,
                        max: 1,
                    },
                ));
            }
            continue;
        }
        let size = tensor.shape[d].get();
        if ext == 0 {
            return Err(e(
                EXTENT[d],
                Problem::OutOfRange {
                    value: 0,
                    min: 1,
                    max: size as u64,
                },
            ));
        }
        let end = off as u64 + ext as u64;
        if end > size as u64 {
            return Err(e(
                EXTENT[d],
                Problem::RegionOutside {
                    dim: d as u32,
                    end,
                    size,
                },
            ));
        }
        if d + 2 < rank && ext != 1 {
            return Err(e(
                EXTENT[d],
                Problem::NotATile {
                    dim: d as u32,
                    extent: ext,
                },
            ));
        }
    }
    let view = TileView::of(tensor, region);
    Ok(wsp_ffi::TileShape {
        rows: view.rows,
        cols: view.cols,
        dtype: tensor.dtype.get(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use zerocopy::little_endian::{U32, U64};

    /// An f32 tensor of `rank` (valid or not) and `shape`; its strides
    /// are 0, which the region test does not read.
    fn tensor(rank: u32, shape: [u32; MAX_RANK]) -> TensorDesc {
        TensorDesc {
            name: [0; 16],
            dtype: U32::new(wsp_ffi::DTYPE_F32),
            rank: U32::new(rank),
            shape: shape.map(U32::new),
            strides: [0; MAX_RANK].map(U32::new),
            arena_offset: U64::new(0),
        }
    }

    fn region(offset: [u32; MAX_RANK], extent: [u32; MAX_RANK]) -> Region {
        Region { offset, extent }
    }

    #[test]
    fn a_tile_and_the_first_field_that_is_wrong() {
        // A 4 x 8 matrix: rows 1..3, columns 2..5 are a 2 x 3 tile.
        let m = tensor(2, [4, 8, 0, 0]);
        let shape = check_region(&m, &region([1, 2, 0, 0], [2, 3, 1, 1])).unwrap();
        assert_eq!((shape.rows, shape.cols), (2, 3));
        // Columns 6..9 end past the 8 columns.
        let e = check_region(&m, &region([1, 6, 0, 0], [2, 3, 1, 1])).unwrap_err();
        let outside = Problem::RegionOutside {
            dim: 1,
            end: 9,
            size: 8,
        };
        assert_eq!(e, ("extent[1]", outside));
        // An empty extent, an offset beyond the rank, an extent beyond it.
        let e = check_region(&m, &region([1, 2, 0, 0], [0, 3, 1, 1])).unwrap_err();
        assert_eq!(e.0, "extent[0]");
        let e = check_region(&m, &region([1, 2, 1, 0], [2, 3, 1, 1])).unwrap_err();
        assert_eq!(e.0, "offset[2]");
        let e = check_region(&m, &region([1, 2, 0, 0], [2, 3, 1, 2])).unwrap_err();
        assert_eq!(e.0, "extent[3]");
        // Rank 3: the first dimension is one matrix of the batch.
        let b = tensor(3, [5, 4, 8, 0]);
        let shape = check_region(&b, &region([4, 0, 0, 0], [1, 4, 8, 1])).unwrap();
        assert_eq!((shape.rows, shape.cols), (4, 8));
        let e = check_region(&b, &region([3, 0, 0, 0], [2, 4, 8, 1])).unwrap_err();
        let not_a_tile = Problem::NotATile { dim: 0, extent: 2 };
        assert_eq!(e, ("extent[0]", not_a_tile));
        // Rank 1: one row.
        let v = tensor(1, [10, 0, 0, 0]);
        let shape = check_region(&v, &region([3, 0, 0, 0], [7, 1, 1, 1])).unwrap();
        assert_eq!((shape.rows, shape.cols), (1, 7));
        // No rank: no tile, and no panic.
        let e = check_region(&tensor(0, [0; 4]), &region([0; 4], [1; 4])).unwrap_err();
        assert_eq!(e.0, "rank");
    }

    /// Small values, and the largest ones (sums of two of them pass 2^32).
    fn value() -> impl Strategy<Value = u32> {
        prop_oneof![8 => 0u32..6, 1 => Just(u32::MAX), 1 => Just(u32::MAX - 1)]
    }

    /// One dimension's offset and extent: mostly what a tile has (offset
    /// 0 and extent 1, as beyond the rank and before a tile's rows; or a
    /// short span), else anything, so that most regions are wrong in at
    /// most a field or two and each test gets to be the first that fails.
    fn span() -> impl Strategy<Value = (u32, u32)> {
        prop_oneof![
            4 => Just((0, 1)),
            4 => (0u32..4, 1u32..4),
            1 => (value(), value()),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4096))]
        /// The one-pass test agrees with the tests one after the other on
        /// every region of every tensor: the same tile shape, or the same
        /// first failing field and problem.
        #[test]
        fn one_pass_agrees_with_each_test_in_turn(
            rank in 0u32..=5,
            shape in prop::array::uniform4(value()),
            spans in prop::array::uniform4(span()),
        ) {
            let t = tensor(rank, shape);
            let r = region(spans.map(|s| s.0), spans.map(|s| s.1));
            prop_assert_eq!(check_region(&t, &r), region_problem(&t, &r));
        }
    }
}
