//! `TableBuilder`: writes descriptor tables (ABI v3) from tensors, tasks,
//! the streams and events that order them, and a workload program (see
//! [`crate::program`], which builds one).

use device_runtime::abi::program::OP_HEAP;
use device_runtime::abi::{
    table_checksum, Instr, KernelDesc, SectionRef, StreamOp, TableHeader, TaskDesc, TensorArg,
    TensorDesc, ABI_VERSION, HEADER_SIZE, MAGIC, MAX_EVENTS, MAX_RANK, MAX_SCALARS, MAX_STREAMS,
    SCRATCH_OFFSET, STREAM_OP_RECORD, STREAM_OP_WAIT,
};
use wsp_ffi::{ArgAccess, DTYPE_F32, DTYPE_I32};
use zerocopy::little_endian::{U32, U64};
use zerocopy::IntoBytes;

/// Arena offsets of tensors are aligned to this many bytes.
pub const TENSOR_ALIGN: u64 = 64;

/// A tensor of a table under construction (its index in the tensors section).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TensorId(pub u32);

/// A row-major tensor (f32 or i32) as laid out in the arena.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorLayout {
    /// The name given at declaration; the table keeps its first 16 bytes.
    pub name: String,
    /// Size of each dimension, outermost first (rank 1 to 4).
    pub shape: Vec<u32>,
    /// `DTYPE_F32` or `DTYPE_I32` (both 4 bytes).
    pub dtype: u32,
    /// Byte offset of element 0 in the arena; `SCRATCH_OFFSET` for a
    /// scratch tensor, which has no arena bytes ([`TableBuilder::scratch`]).
    pub arena_offset: u64,
}

impl TensorLayout {
    /// Number of elements: the product of the shape.
    pub fn elements(&self) -> usize {
        self.shape.iter().map(|&d| d as usize).product()
    }
    /// Whether it is a scratch tensor: its storage is lent by the heap
    /// ring while it is live, and the arena holds none of it.
    pub fn is_scratch(&self) -> bool {
        self.arena_offset == SCRATCH_OFFSET
    }
    /// Bytes of its elements.
    pub fn bytes(&self) -> u64 {
        self.elements() as u64 * 4
    }
    fn byte_range(&self) -> std::ops::Range<usize> {
        assert!(
            !self.is_scratch(),
            "tensor {} is a scratch tensor: it has no arena bytes",
            self.name
        );
        let start = self.arena_offset as usize;
        start..start + self.elements() * 4
    }
}

/// One tensor argument of a task: a region of a tensor and how it is accessed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Arg {
    /// The tensor the region lies in.
    pub tensor: TensorId,
    /// Whether the kernel reads the region, writes it, or both.
    pub access: ArgAccess,
    /// First index of the region per dimension (0 beyond the rank).
    pub offset: [u32; MAX_RANK],
    /// Size of the region per dimension (1 beyond the rank); only the last
    /// two dimensions may exceed 1.
    pub extent: [u32; MAX_RANK],
}

impl Arg {
    /// A `rows` x `cols` tile at (`row`, `col`) of a 2-D tensor.
    pub fn tile(
        tensor: TensorId,
        access: ArgAccess,
        row: u32,
        col: u32,
        rows: u32,
        cols: u32,
    ) -> Arg {
        Arg {
            tensor,
            access,
            offset: [row, col, 0, 0],
            extent: [rows, cols, 1, 1],
        }
    }
}

/// Why a task could not be added.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BuildError {
    /// A kernel id not in the kernel registry.
    UnknownKernel(u32),
    /// A tensor id not declared on this builder.
    UnknownTensor(u32),
    /// A task gives a kernel the wrong number of tensor arguments.
    ArgCount {
        /// The kernel's registry name.
        kernel: &'static str,
        /// Tensor arguments the kernel takes.
        expected: u32,
        /// Tensor arguments the task gave.
        got: usize,
    },
    /// A task gives a kernel the wrong number of scalars.
    ScalarCount {
        /// The kernel's registry name.
        kernel: &'static str,
        /// Scalars the kernel takes.
        expected: u32,
        /// Scalars the task gave.
        got: usize,
    },
    /// A tensor shape of rank 0 or above 4, or with a zero size (the message
    /// names the tensor and its shape).
    BadShape(String),
    /// The table's sections (or the entries of one) do not fit the ABI's
    /// 32-bit offsets and counts; names which.
    TooLarge(&'static str),
    /// A stream number outside 1 ..= `MAX_STREAMS`.
    NoSuchStream(u32),
    /// An event number outside 0 .. `MAX_EVENTS`.
    NoSuchEvent(u32),
    /// A wait on an event not recorded before it.
    EventNotRecorded(u32),
    /// Scratch tensors without heap ring bytes ([`TableBuilder::heap`]), or
    /// a heap size that is not a positive multiple of 64 below 4 GiB.
    NoHeap(u64),
    /// A heap ring ([`TableBuilder::heap`]) of this many bytes in a table
    /// without scratch tensors: nothing would use it.
    HeapUnused(u64),
    /// A tensor name whose first 16 bytes (what the table keeps, and the
    /// device's reports and `wsp inspect` show) an earlier tensor's name
    /// already starts with.
    DuplicateName {
        /// The name given.
        name: String,
        /// The earlier tensor's id and name.
        earlier: (u32, String),
    },
}

impl std::fmt::Display for BuildError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BuildError::UnknownKernel(id) => {
                write!(f, "kernel id {id} is not in the kernel registry")
            }
            BuildError::UnknownTensor(t) => write!(f, "tensor {t} was not declared"),
            BuildError::ArgCount {
                kernel,
                expected,
                got,
            } => {
                write!(
                    f,
                    "kernel {kernel} takes {expected} tensor arguments, got {got}"
                )
            }
            BuildError::ScalarCount {
                kernel,
                expected,
                got,
            } => {
                write!(f, "kernel {kernel} takes {expected} scalars, got {got}")
            }
            BuildError::BadShape(why) => write!(f, "bad tensor shape: {why}"),
            BuildError::TooLarge(what) => {
                write!(f, "the table's {what} exceed the ABI's 32-bit limits")
            }
            BuildError::NoSuchStream(s) => {
                write!(f, "stream {s}; streams are 1 to {MAX_STREAMS}")
            }
            BuildError::NoHeap(0) => f.write_str(
                "scratch tensors need heap ring bytes: call heap(bytes) (or `heap = N` in a workload file)",
            ),
            BuildError::NoHeap(n) => write!(
                f,
                "heap ring of {n} bytes: it must be a positive multiple of 64 below 4 GiB"
            ),
            BuildError::HeapUnused(n) => write!(
                f,
                "heap ring of {n} bytes, but no scratch tensor uses it: declare one or leave out heap"
            ),
            BuildError::DuplicateName {
                name,
                earlier: (id, other),
            } => write!(
                f,
                "tensor name `{name}`: tensor {id} is called `{other}`, and the table keeps \
                 only the first 16 bytes of a name, which would be the same"
            ),
            BuildError::NoSuchEvent(e) => {
                write!(f, "event {e}; events are 0 to {}", MAX_EVENTS - 1)
            }
            BuildError::EventNotRecorded(e) => {
                write!(f, "wait on event {e}, which is not recorded before it")
            }
        }
    }
}

impl std::error::Error for BuildError {}

/// Builds one descriptor table. Table order of tasks is program order.
#[derive(Default)]
pub struct TableBuilder {
    tensors: Vec<TensorLayout>,
    arena_size: u64,
    kernels: Vec<KernelDesc>,
    tasks: Vec<TaskDesc>,
    args: Vec<TensorArg>,
    stream_ops: Vec<StreamOp>,
    program: Vec<Instr>,
    /// Bytes of the heap ring (the arena's last bytes); 0: none.
    heap: u64,
}

impl TableBuilder {
    /// An empty table: no tensors, tasks, stream ops or program.
    pub fn new() -> Self {
        Self::default()
    }

    /// Declares a row-major f32 tensor of `shape` (rank 1 to 4, no zero
    /// sizes). The table keeps the first 16 bytes of `name`, which must
    /// differ from every earlier tensor's ([`BuildError::DuplicateName`]):
    /// the device's reports name tensors by them.
    pub fn tensor(&mut self, name: &str, shape: &[u32]) -> Result<TensorId, BuildError> {
        self.tensor_of(name, shape, DTYPE_F32)
    }

    /// Declares a row-major i32 tensor (indices, lengths, routing data).
    pub fn tensor_i32(&mut self, name: &str, shape: &[u32]) -> Result<TensorId, BuildError> {
        self.tensor_of(name, shape, DTYPE_I32)
    }

    fn tensor_of(&mut self, name: &str, shape: &[u32], dtype: u32) -> Result<TensorId, BuildError> {
        self.check_name(name)?;
        let bytes = shape_bytes(name, shape)?;
        let arena_offset = self.arena_size.next_multiple_of(TENSOR_ALIGN);
        let end = arena_offset.checked_add(bytes).ok_or_else(|| {
            BuildError::BadShape(format!(
                "{name}: {shape:?} ({bytes} bytes) would end the arena past 2^64 bytes"
            ))
        })?;
        self.arena_size = end;
        self.tensors.push(TensorLayout {
            name: name.to_string(),
            shape: shape.to_vec(),
            dtype,
            arena_offset,
        });
        Ok(TensorId(self.tensors.len() as u32 - 1))
    }

    /// Declares a row-major f32 *scratch* tensor: an intermediate with no
    /// arena bytes. Its storage comes from the heap ring ([`Self::heap`])
    /// when its first writer is submitted and returns after the last task
    /// that names it retires (in a program: after its `FREE`, see
    /// [`crate::program::Workload::free`]). The host cannot read or write
    /// it: make inputs and results arena tensors.
    pub fn scratch(&mut self, name: &str, shape: &[u32]) -> Result<TensorId, BuildError> {
        self.check_name(name)?;
        let bytes = shape_bytes(name, shape)?;
        if bytes > MAX_HEAP {
            return Err(BuildError::BadShape(format!(
                "{name}: {shape:?} is a scratch tensor of {bytes} bytes; \
                 the heap ring that holds it has at most {MAX_HEAP}"
            )));
        }
        self.tensors.push(TensorLayout {
            name: name.to_string(),
            shape: shape.to_vec(),
            dtype: DTYPE_F32,
            arena_offset: SCRATCH_OFFSET,
        });
        Ok(TensorId(self.tensors.len() as u32 - 1))
    }

    /// Refuses `name` if the table would not tell it from an earlier
    /// tensor's: the same first 16 bytes.
    fn check_name(&self, name: &str) -> Result<(), BuildError> {
        let kept = |n: &str| table_name(n);
        match self
            .tensors
            .iter()
            .position(|t| kept(&t.name) == kept(name))
        {
            Some(i) => Err(BuildError::DuplicateName {
                name: name.to_string(),
                earlier: (i as u32, self.tensors[i].name.clone()),
            }),
            None => Ok(()),
        }
    }

    /// Gives the table a heap ring of `bytes` (a multiple of 64): the
    /// arena's last `bytes` bytes, which hold the scratch tensors that are
    /// live at once. A table with a heap ring and no scratch tensor is
    /// refused by [`TableBuilder::finish`] ([`BuildError::HeapUnused`]).
    pub fn heap(&mut self, bytes: u64) -> Result<(), BuildError> {
        if bytes == 0 || !bytes.is_multiple_of(64) || bytes > MAX_HEAP {
            return Err(BuildError::NoHeap(bytes));
        }
        self.heap = bytes;
        Ok(())
    }

    /// Bytes of the heap ring (0: none).
    pub fn heap_bytes(&self) -> u64 {
        self.heap
    }

    /// Arena bytes the scratch tensors save: what they would take as arena
    /// tensors (each aligned to [`TENSOR_ALIGN`]) minus the heap ring.
    pub fn arena_saved(&self) -> i64 {
        let scratch: u64 = self
            .tensors
            .iter()
            .filter(|t| t.is_scratch())
            .map(|t| t.bytes().next_multiple_of(TENSOR_ALIGN))
            .sum();
        scratch as i64 - self.heap as i64
    }

    /// The layout of a tensor declared on this builder (panics on an id it
    /// did not return).
    pub fn layout(&self, tensor: TensorId) -> &TensorLayout {
        &self.tensors[tensor.0 as usize]
    }

    /// The layouts of all tensors, in declaration order (index = `TensorId`).
    pub fn layouts(&self) -> &[TensorLayout] {
        &self.tensors
    }

    /// Bytes the arena needs: the end of the last tensor declared, then
    /// the heap ring (at a multiple of 64), if any.
    pub fn arena_size(&self) -> u64 {
        if self.heap == 0 {
            self.arena_size
        } else {
            self.arena_size.next_multiple_of(TENSOR_ALIGN) + self.heap
        }
    }

    /// Tasks added so far (the program's calls not counted).
    pub fn num_tasks(&self) -> usize {
        self.tasks.len()
    }

    /// Appends a call of `kernel_id` on no stream; the kernel is declared
    /// on first use.
    pub fn task(
        &mut self,
        kernel_id: u32,
        args: &[Arg],
        scalars: &[u64],
    ) -> Result<(), BuildError> {
        self.task_on(0, kernel_id, args, scalars)
    }

    /// Appends a call of `kernel_id` on `stream` (1 ..= `MAX_STREAMS`, or 0
    /// for none): it is issued after the stream's previous task.
    pub fn task_on(
        &mut self,
        stream: u32,
        kernel_id: u32,
        args: &[Arg],
        scalars: &[u64],
    ) -> Result<(), BuildError> {
        if stream as usize > MAX_STREAMS {
            return Err(BuildError::NoSuchStream(stream));
        }
        let info = wsp_ffi::lookup(kernel_id).ok_or(BuildError::UnknownKernel(kernel_id))?;
        if args.len() != info.num_tensors as usize {
            return Err(BuildError::ArgCount {
                kernel: info.name,
                expected: info.num_tensors,
                got: args.len(),
            });
        }
        if scalars.len() != info.num_scalars as usize || scalars.len() > MAX_SCALARS {
            return Err(BuildError::ScalarCount {
                kernel: info.name,
                expected: info.num_scalars,
                got: scalars.len(),
            });
        }
        if let Some(bad) = args
            .iter()
            .find(|a| a.tensor.0 as usize >= self.tensors.len())
        {
            return Err(BuildError::UnknownTensor(bad.tensor.0));
        }
        self.declare_kernel(kernel_id)?;
        let mut s = [U64::new(0); MAX_SCALARS];
        for (dst, &v) in s.iter_mut().zip(scalars) {
            *dst = U64::new(v);
        }
        self.tasks.push(TaskDesc {
            kernel_id: U32::new(kernel_id),
            first_arg: U32::new(self.args.len() as u32),
            num_args: U32::new(args.len() as u32),
            num_scalars: U32::new(scalars.len() as u32),
            scalars: s,
            stream: U32::new(stream),
            reserved: U32::new(0),
        });
        self.args.extend(args.iter().map(|a| TensorArg {
            tensor: U32::new(a.tensor.0),
            access: U32::new(a.access as u32),
            offset: a.offset.map(U32::new),
            extent: a.extent.map(U32::new),
        }));
        Ok(())
    }

    /// Records `event` on `stream` here: it stands for the stream's tasks
    /// added so far and happens when all of them have completed.
    pub fn record_event(&mut self, stream: u32, event: u32) -> Result<(), BuildError> {
        check_stream_event(stream, event)?;
        self.push_stream_op(STREAM_OP_RECORD, stream, event);
        Ok(())
    }

    /// Makes the next task added on `stream`, and so every later one, wait
    /// for `event` as last recorded.
    pub fn wait_event(&mut self, stream: u32, event: u32) -> Result<(), BuildError> {
        check_stream_event(stream, event)?;
        let recorded = self
            .stream_ops
            .iter()
            .any(|op| op.op.get() == STREAM_OP_RECORD && op.event.get() == event);
        if !recorded {
            return Err(BuildError::EventNotRecorded(event));
        }
        self.push_stream_op(STREAM_OP_WAIT, stream, event);
        Ok(())
    }

    /// Sets the workload program, run after the tasks (see [`crate::program`]).
    pub fn set_program(&mut self, program: Vec<Instr>) {
        self.program = program;
    }

    /// Declares `kernel_id` in the kernels section (calls of the program
    /// need it declared; [`TableBuilder::task`] declares its own).
    pub fn declare_kernel(&mut self, kernel_id: u32) -> Result<(), BuildError> {
        let info = wsp_ffi::lookup(kernel_id).ok_or(BuildError::UnknownKernel(kernel_id))?;
        if !self.kernels.iter().any(|k| k.kernel_id.get() == kernel_id) {
            self.kernels.push(KernelDesc {
                kernel_id: U32::new(kernel_id),
                core_kind: U32::new(info.kind as u32),
                num_tensors: U32::new(info.num_tensors),
                num_scalars: U32::new(info.num_scalars),
            });
        }
        Ok(())
    }

    fn push_stream_op(&mut self, op: u32, stream: u32, event: u32) {
        self.stream_ops.push(StreamOp {
            op: U32::new(op),
            stream: U32::new(stream),
            event: U32::new(event),
            before_task: U32::new(self.tasks.len() as u32),
        });
    }

    /// Writes the table: header, then tensors, kernels, tasks, args, stream
    /// ops and the program.
    pub fn finish(&self) -> Result<Vec<u8>, BuildError> {
        let tensors: Vec<TensorDesc> = self.tensors.iter().map(tensor_desc).collect();
        let scratch = self.tensors.iter().any(|t| t.is_scratch());
        if self.heap == 0 && scratch {
            return Err(BuildError::NoHeap(0));
        }
        if self.heap > 0 && !scratch {
            return Err(BuildError::HeapUnused(self.heap));
        }
        // The heap ring's size goes last: a declaration at the top level,
        // which moves no pc the program's jumps and loops name.
        let mut program = self.program.clone();
        if self.heap > 0 {
            program.push(Instr {
                op: OP_HEAP,
                r: 0,
                x: [device_runtime::abi::program::NO_REG; 6],
                imm: U32::new(self.heap as u32),
                imm2: U32::new(0),
            });
        }
        let mut out = vec![0u8; HEADER_SIZE];
        let mut section = |bytes: &[u8], count: usize| -> Result<SectionRef, BuildError> {
            let offset = u32::try_from(out.len()).map_err(|_| BuildError::TooLarge("sections"))?;
            let count = u32::try_from(count).map_err(|_| BuildError::TooLarge("entries"))?;
            out.extend_from_slice(bytes);
            Ok(SectionRef {
                offset: U32::new(offset),
                count: U32::new(count),
            })
        };
        let tensors_ref = section(tensors.as_bytes(), tensors.len())?;
        let kernels_ref = section(self.kernels.as_bytes(), self.kernels.len())?;
        let tasks_ref = section(self.tasks.as_bytes(), self.tasks.len())?;
        let args_ref = section(self.args.as_bytes(), self.args.len())?;
        let stream_ops_ref = section(self.stream_ops.as_bytes(), self.stream_ops.len())?;
        let program_ref = section(program.as_bytes(), program.len())?;
        let total_len = u32::try_from(out.len()).map_err(|_| BuildError::TooLarge("sections"))?;
        let header = TableHeader {
            magic: MAGIC,
            abi_version: U32::new(ABI_VERSION),
            header_size: U32::new(HEADER_SIZE as u32),
            total_len: U32::new(total_len),
            checksum: U32::new(0),
            arena_size: U64::new(self.arena_size()),
            tensors: tensors_ref,
            kernels: kernels_ref,
            tasks: tasks_ref,
            args: args_ref,
            stream_ops: stream_ops_ref,
            program: program_ref,
        };
        out[..HEADER_SIZE].copy_from_slice(header.as_bytes());
        seal(&mut out);
        Ok(out)
    }
}

/// The most bytes a heap ring has: the largest multiple of 64 that the
/// program's 32-bit `HEAP` operand holds.
const MAX_HEAP: u64 = u32::MAX as u64 / 64 * 64;

/// The product of `factors`, sizes that together make one tensor
/// dimension, region extent or count (e.g. the `B x kv_heads` rows of a
/// tensor of partial states): exact, or [`BuildError::BadShape`] naming
/// `what` and the factors when it does not fit the table's 32-bit sizes.
/// The one check for such products where the factors' own checks do not
/// bound them, instead of `u32` arithmetic that panics (debug builds) or
/// wraps to a wrong size (release). Any factor 0 makes 0.
pub fn product(what: &str, factors: &[u32]) -> Result<u32, BuildError> {
    if factors.contains(&0) {
        return Ok(0);
    }
    factors
        .iter()
        .try_fold(1u32, |p, &f| p.checked_mul(f))
        .ok_or_else(|| {
            let each: Vec<String> = factors.iter().map(|f| f.to_string()).collect();
            let exact: u128 = factors.iter().map(|&f| f as u128).product();
            BuildError::BadShape(format!(
                "{what}: {} = {exact} exceeds the table's 32-bit sizes",
                each.join(" x ")
            ))
        })
}

/// The bytes of a tensor of `shape` (4-byte elements), or why the table
/// cannot hold it: a rank outside 1 ..= 4, a zero size, a row-major stride
/// past the table's 32-bit strides, or a size past 2^64 bytes.
fn shape_bytes(name: &str, shape: &[u32]) -> Result<u64, BuildError> {
    if shape.is_empty() || shape.len() > MAX_RANK || shape.contains(&0) {
        return Err(BuildError::BadShape(format!(
            "{name}: {shape:?} (rank 1..=4, sizes > 0)"
        )));
    }
    // Dimension d's stride is the product of the sizes inside it: the
    // table stores it in 32 bits.
    let mut stride = 1u64;
    for d in (1..shape.len()).rev() {
        stride *= shape[d] as u64;
        if stride > u32::MAX as u64 {
            return Err(BuildError::BadShape(format!(
                "{name}: {shape:?}: dimension {} has a stride of {stride} elements; \
                 the table's strides are 32-bit (at most {})",
                d - 1,
                u32::MAX
            )));
        }
    }
    (shape[0] as u64)
        .checked_mul(stride)
        .and_then(|elements| elements.checked_mul(4))
        .ok_or_else(|| {
            BuildError::BadShape(format!(
                "{name}: {shape:?}: its size in bytes does not fit in 64 bits"
            ))
        })
}

fn check_stream_event(stream: u32, event: u32) -> Result<(), BuildError> {
    if stream == 0 || stream as usize > MAX_STREAMS {
        return Err(BuildError::NoSuchStream(stream));
    }
    if event as usize >= MAX_EVENTS {
        return Err(BuildError::NoSuchEvent(event));
    }
    Ok(())
}

/// Recomputes and stores the checksum of a table (after editing its bytes).
pub fn seal(table: &mut [u8]) {
    let crc = table_checksum(table);
    table[device_runtime::abi::CHECKSUM_FIELD].copy_from_slice(&crc.to_le_bytes());
}

/// The name as the table keeps it: its first 16 bytes, 0-padded.
fn table_name(name: &str) -> [u8; 16] {
    let mut kept = [0u8; 16];
    let n = name.len().min(16);
    kept[..n].copy_from_slice(&name.as_bytes()[..n]);
    kept
}

fn tensor_desc(t: &TensorLayout) -> TensorDesc {
    let name = table_name(&t.name);
    let mut shape = [U32::new(0); MAX_RANK];
    let mut strides = [U32::new(0); MAX_RANK];
    let mut stride = 1u32;
    for d in (0..t.shape.len()).rev() {
        shape[d] = U32::new(t.shape[d]);
        strides[d] = U32::new(stride);
        stride = stride.saturating_mul(t.shape[d]);
    }
    TensorDesc {
        name,
        dtype: U32::new(t.dtype),
        rank: U32::new(t.shape.len() as u32),
        shape,
        strides,
        arena_offset: U64::new(t.arena_offset),
    }
}

/// The data arena of a table: tensor bytes at their arena offsets.
#[derive(Clone, Debug, PartialEq)]
pub struct Arena {
    /// The arena's contents, `arena_size` bytes long.
    pub bytes: Vec<u8>,
}

impl Arena {
    /// A zeroed arena of `size` bytes.
    pub fn zeroed(size: u64) -> Arena {
        Arena {
            bytes: vec![0; size as usize],
        }
    }

    /// Stores `values` (one per element, row-major) in an f32 tensor; panics
    /// on an i32 tensor or a wrong count.
    pub fn write_f32(&mut self, tensor: &TensorLayout, values: &[f32]) {
        assert_eq!(tensor.dtype, DTYPE_F32, "tensor {} is not f32", tensor.name);
        self.write_words(tensor, values.iter().map(|v| v.to_le_bytes()), values.len());
    }

    /// Stores `values` (one per element, row-major) in an i32 tensor; panics
    /// on an f32 tensor or a wrong count.
    pub fn write_i32(&mut self, tensor: &TensorLayout, values: &[i32]) {
        assert_eq!(tensor.dtype, DTYPE_I32, "tensor {} is not i32", tensor.name);
        self.write_words(tensor, values.iter().map(|v| v.to_le_bytes()), values.len());
    }

    fn write_words(
        &mut self,
        tensor: &TensorLayout,
        words: impl Iterator<Item = [u8; 4]>,
        n: usize,
    ) {
        assert_eq!(n, tensor.elements(), "values for tensor {}", tensor.name);
        let range = tensor.byte_range();
        for (chunk, w) in self.bytes[range].chunks_exact_mut(4).zip(words) {
            chunk.copy_from_slice(&w);
        }
    }

    /// The elements of a tensor read as i32, row-major.
    pub fn read_i32(&self, tensor: &TensorLayout) -> Vec<i32> {
        let range = tensor.byte_range();
        self.bytes[range]
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }

    /// The elements of a tensor read as f32, row-major.
    pub fn read_f32(&self, tensor: &TensorLayout) -> Vec<f32> {
        let range = tensor.byte_range();
        self.bytes[range]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use device_runtime::abi::Table;

    #[test]
    fn size_products_are_exact_or_refused_naming_the_factors() {
        // 65536 x 65535 = 2^32 - 2^16 = 4294901760 fits u32; 4096 x 2^20
        // = 2^32 is one past u32::MAX.
        assert_eq!(product("rows", &[65536, 65535]), Ok(4_294_901_760));
        assert_eq!(
            product("parts rows", &[4096, 1 << 20]),
            Err(BuildError::BadShape(
                "parts rows: 4096 x 1048576 = 4294967296 exceeds the table's 32-bit sizes".into()
            ))
        );
        // A zero factor is 0 even after factors whose product overflows;
        // no factors multiply to 1.
        assert_eq!(product("rows", &[u32::MAX, u32::MAX, 0]), Ok(0));
        assert_eq!(product("rows", &[]), Ok(1));
    }

    #[test]
    fn a_built_table_parses_with_the_fields_given() {
        let mut b = TableBuilder::new();
        let a = b.tensor("A", &[64, 32]).unwrap();
        let c = b.tensor("C", &[64, 32]).unwrap();
        let id = wsp_ffi::WspKernelId_WSP_KERNEL_ADD;
        let args = [
            Arg::tile(a, ArgAccess::In, 0, 0, 32, 32),
            Arg::tile(a, ArgAccess::In, 32, 0, 32, 32),
        ];
        b.task(
            id,
            &[
                args[0],
                args[1],
                Arg::tile(c, ArgAccess::Out, 32, 0, 32, 32),
            ],
            &[],
        )
        .unwrap();
        let bytes = b.finish().unwrap();
        let table = Table::parse(&bytes).unwrap();
        assert_eq!(table.tensors().len(), 2);
        assert_eq!(table.tensors()[1].arena_offset.get(), 64 * 32 * 4);
        assert_eq!(table.tensors()[0].strides[0].get(), 32);
        assert_eq!(table.kernels().len(), 1);
        assert_eq!(table.tasks().len(), 1);
        let targs = table.task_args(&table.tasks()[0]);
        assert_eq!(targs[2].offset[0].get(), 32);
        assert_eq!(targs[2].access.get(), ArgAccess::Out as u32);
        assert_eq!(table.arena_size(), 2 * 64 * 32 * 4);
    }

    #[test]
    fn wrong_calls_are_refused_at_build_time() {
        let mut b = TableBuilder::new();
        let a = b.tensor("A", &[4, 4]).unwrap();
        assert_eq!(b.task(77, &[], &[]), Err(BuildError::UnknownKernel(77)));
        let arg = Arg::tile(a, ArgAccess::In, 0, 0, 4, 4);
        assert!(matches!(
            b.task(wsp_ffi::WspKernelId_WSP_KERNEL_ADD, &[arg], &[]),
            Err(BuildError::ArgCount { .. })
        ));
        assert!(b.tensor("Z", &[0, 4]).is_err());
    }

    fn bad_shape(result: Result<TensorId, BuildError>) -> String {
        match result {
            Err(BuildError::BadShape(why)) => why,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn shapes_the_table_cannot_hold_are_refused_without_overflow() {
        let mut b = TableBuilder::new();
        // Dimension 0's stride is 2^31 * 2 = 2^32 elements: one past the
        // table's 32-bit strides.
        let why = bad_shape(b.tensor("s", &[2, 1 << 31, 2]));
        assert!(
            why.contains("dimension 0 has a stride of 4294967296"),
            "{why}"
        );
        let why = bad_shape(b.tensor("s", &[u32::MAX; 4]));
        assert!(why.contains("stride"), "{why}");
        // (2^32 - 1)^2 elements of 4 bytes: about 2^66 bytes.
        let why = bad_shape(b.tensor_i32("b", &[u32::MAX, u32::MAX]));
        assert!(why.contains("does not fit in 64 bits"), "{why}");
        assert_eq!(b.arena_size(), 0, "nothing refused takes arena bytes");
        // 2^30 x 2^30 f32 is 2^62 bytes: three fit below 2^64, the fourth
        // would end at 2^64.
        for i in 0..3 {
            b.tensor(&format!("q{i}"), &[1 << 30, 1 << 30]).unwrap();
        }
        assert_eq!(b.arena_size(), 3 << 62);
        let why = bad_shape(b.tensor("q3", &[1 << 30, 1 << 30]));
        assert!(why.contains("past 2^64 bytes"), "{why}");
        assert_eq!(b.layouts().len(), 3);
        // A scratch tensor lives in the heap ring, below 4 GiB: 2^14 x
        // 2^16 f32 is 2^32 bytes, 64 more than the largest ring.
        let why = bad_shape(b.scratch("t", &[1 << 14, 1 << 16]));
        assert!(why.contains("scratch tensor of 4294967296 bytes"), "{why}");
        assert!(why.contains("at most 4294967232"), "{why}");
        b.scratch("t", &[1 << 14, (1 << 16) - 16]).unwrap();
        b.heap(u32::MAX as u64 / 64 * 64).unwrap();
        assert_eq!(b.heap(1 << 32), Err(BuildError::NoHeap(1 << 32)));
    }

    #[test]
    fn names_the_table_would_not_tell_apart_are_refused() {
        let mut b = TableBuilder::new();
        b.tensor("x", &[1, 1]).unwrap();
        b.tensor("attention_scores_q", &[1, 1]).unwrap();
        // Same name, another kind of tensor.
        let e = b.scratch("x", &[1, 1]).unwrap_err();
        assert_eq!(
            e,
            BuildError::DuplicateName {
                name: "x".into(),
                earlier: (0, "x".into())
            }
        );
        // The same first 16 bytes, "attention_scores".
        let e = b.tensor_i32("attention_scores_k", &[1, 1]).unwrap_err();
        assert!(
            e.to_string()
                .contains("tensor 1 is called `attention_scores_q`"),
            "{e}"
        );
        // A 15-byte prefix is another name; a 17-byte name is the same.
        b.tensor("attention_score", &[1, 1]).unwrap();
        b.tensor("attention_scoresq", &[1, 1]).unwrap_err();
        assert_eq!(b.layouts().len(), 3);
    }

    #[test]
    fn a_heap_ring_without_scratch_tensors_is_refused() {
        let mut b = TableBuilder::new();
        let x = b.tensor("x", &[1, 1]).unwrap();
        let y = b.tensor("y", &[1, 1]).unwrap();
        let add = wsp_ffi::WspKernelId_WSP_KERNEL_ADD;
        let one = |t, access| Arg::tile(t, access, 0, 0, 1, 1);
        let args = [
            one(x, ArgAccess::In),
            one(x, ArgAccess::In),
            one(y, ArgAccess::Out),
        ];
        b.task(add, &args, &[]).unwrap();
        b.heap(128).unwrap();
        let e = b.finish().unwrap_err();
        assert_eq!(e, BuildError::HeapUnused(128));
        assert!(e.to_string().contains("no scratch tensor uses it"), "{e}");
        b.scratch("s", &[1, 1]).unwrap();
        b.finish().unwrap();
    }
}
