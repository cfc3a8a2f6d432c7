//! Launch records: what a scheduler thread needs to launch a task that the
//! program's expansion produced (it is in no table), written by the
//! dispatcher when it submits the task and read by whichever thread issues
//! it. Tasks of the tasks section launch from the table, which threads
//! share read-only: a record crosses between cores, three cache lines per
//! task, which made independent table tasks about 1.4x slower end to end.
//!
//! One record per slot of the task window (task number modulo
//! [`TASK_WINDOW`]): a slot is rewritten only after its previous task
//! completed and the dispatcher collected the completion, which happens
//! after the thread that issued it is done reading. The words are atomics
//! written and read `Relaxed`: the dispatch queue's push (release) and take
//! (acquire) order the record before its reader, and the completion ring
//! orders the reader before the next write, so no `unsafe` is needed.
//!
//! A view keeps its address and extents; its element type and row stride
//! are its tensor's (see [`TileView::of`](crate::abi::TileView::of)), so
//! the record keeps the tensor's index instead and the reader looks them
//! up in the table (which a rebased scratch view shares too).

use wsp_ffi::{WspKernelArgs, WspTensorView};

use crate::abi::{TensorDesc, MAX_SCALARS, MAX_STREAMS, MAX_TENSORS, MAX_TENSOR_ARGS, TASK_WINDOW};
use crate::expand::NO_VIEW;
use crate::sync::{AtomicU64, Ordering};

/// Words of one record: kernel, stream and counts in one; the tensors'
/// indices in one (16 bits each: a table declares at most
/// [`MAX_TENSORS`]); address and extents per tensor view; one per scalar.
const WORDS: usize = 2 + 2 * MAX_TENSOR_ARGS + MAX_SCALARS;
/// Where the words of the tensors' indices, views and scalars start.
const INDICES: usize = 1;
const VIEWS: usize = INDICES + 1;
const SCALARS: usize = VIEWS + 2 * MAX_TENSOR_ARGS;
/// Bits of a tensor's index in the record.
const INDEX_BITS: usize = 16;
const _: () = assert!(
    MAX_TENSOR_ARGS * INDEX_BITS <= 64
        && MAX_TENSORS <= 1 << INDEX_BITS
        && SCALARS + MAX_SCALARS == WORDS
);
// The first word: the kernel's id, then the stream and the two counts in
// a byte each.
const _: () = assert!(MAX_STREAMS < 256 && MAX_TENSOR_ARGS < 256 && MAX_SCALARS < 256);

/// A decoded record.
#[derive(Clone, Copy, Debug)]
pub struct Launch {
    /// The kernel.
    pub kernel_id: u32,
    /// Its stream (0 for none).
    pub stream: u32,
    /// Tensor addresses are arena offsets until [`Records::read`] adds the base.
    pub args: WspKernelArgs,
    /// The table's index of each view's tensor: the view's element type
    /// and row stride are the tensor's.
    pub tensors: [u32; MAX_TENSOR_ARGS],
}

/// The records of the task window (112 bytes a task: 448 KiB at a window
/// of 4,096; part of [`super::Queues`]).
pub struct Records {
    slots: [[AtomicU64; WORDS]; TASK_WINDOW],
}

impl Records {
    #[cfg(not(loom))]
    /// Empty records.
    pub const fn new() -> Self {
        Records {
            slots: [const { [const { AtomicU64::new(0) }; WORDS] }; TASK_WINDOW],
        }
    }

    /// Empty records (under loom, whose atomics are not `const`).
    #[cfg(loom)]
    pub fn new() -> Self {
        Records {
            slots: core::array::from_fn(|_| core::array::from_fn(|_| AtomicU64::new(0))),
        }
    }

    /// Writes the record of task `task` (its number in the run).
    pub fn write(&self, task: u64, launch: &Launch) {
        let slot = &self.slots[(task % TASK_WINDOW as u64) as usize];
        let args = &launch.args;
        let mut words = [0u64; WORDS];
        // A submitted task's stream and counts are within their bounds.
        debug_assert!(launch.stream as usize <= MAX_STREAMS);
        debug_assert!(args.num_tensors as usize <= MAX_TENSOR_ARGS);
        debug_assert!(args.num_scalars as usize <= MAX_SCALARS);
        words[0] = launch.kernel_id as u64
            | (launch.stream as u8 as u64) << 32
            | (args.num_tensors as u8 as u64) << 40
            | (args.num_scalars as u8 as u64) << 48;
        for (i, &t) in launch.tensors.iter().enumerate() {
            debug_assert!(
                (t as usize) < MAX_TENSORS,
                "validation bounds tensor indices"
            );
            words[INDICES] |= (t as u64 & 0xFFFF) << (INDEX_BITS * i);
        }
        for (i, v) in args.tensors.iter().enumerate() {
            words[VIEWS + 2 * i] = v.addr;
            words[VIEWS + 2 * i + 1] = v.rows as u64 | (v.cols as u64) << 32;
        }
        words[SCALARS..].copy_from_slice(&args.scalars);
        for (w, v) in slot.iter().zip(words) {
            w.store(v, Ordering::Relaxed);
        }
    }

    /// Reads the record of task `task`, with tensor addresses rebased on
    /// `arena_base`; `tensors` are the table's (each view's element type
    /// and row stride are its tensor's). A tensor index outside them (the
    /// writer took it from the same validated table, so never) gives an
    /// empty view.
    pub fn read(&self, task: u64, arena_base: u64, tensors: &[TensorDesc]) -> Launch {
        let slot = &self.slots[(task % TASK_WINDOW as u64) as usize];
        let w = |i: usize| slot[i].load(Ordering::Relaxed);
        let head = w(0);
        let mut args = WspKernelArgs {
            num_tensors: (head >> 40) as u8 as u32,
            num_scalars: (head >> 48) as u8 as u32,
            tensors: [NO_VIEW; MAX_TENSOR_ARGS],
            scalars: [0; MAX_SCALARS],
        };
        let mut indices = [0; MAX_TENSOR_ARGS];
        for (i, (v, index)) in args.tensors.iter_mut().zip(&mut indices).enumerate() {
            if i >= args.num_tensors as usize {
                break;
            }
            *index = (w(INDICES) >> (INDEX_BITS * i)) as u16 as u32;
            let Some(desc) = tensors.get(*index as usize) else {
                continue;
            };
            let shape = w(VIEWS + 2 * i + 1);
            let (rows, cols) = (shape as u32, (shape >> 32) as u32);
            // As `TileView::of`: a rank-1 tile's rows are one row apart.
            let rank = desc.rank.get() as usize;
            let row_stride = match rank.checked_sub(2) {
                Some(d) => desc.strides.get(d).map_or(0, |s| s.get()),
                None => cols,
            };
            *v = WspTensorView {
                addr: arena_base.wrapping_add(w(VIEWS + 2 * i)),
                rows,
                cols,
                row_stride,
                dtype: desc.dtype.get(),
            };
        }
        for (i, s) in args.scalars.iter_mut().enumerate() {
            *s = w(SCALARS + i);
        }
        Launch {
            kernel_id: head as u32,
            stream: (head >> 32) as u8 as u32,
            args,
            tensors: indices,
        }
    }

    /// The kernel of task `task`'s record (for error reports).
    pub fn kernel_id(&self, task: u64) -> u32 {
        self.slots[(task % TASK_WINDOW as u64) as usize][0].load(Ordering::Relaxed) as u32
    }
}

impl Default for Records {
    fn default() -> Self {
        Records::new()
    }
}

#[cfg(test)]
#[cfg(not(loom))]
mod tests {
    use std::boxed::Box;
    use std::vec::Vec;

    use zerocopy::little_endian::{U32, U64};

    use super::*;
    use crate::abi::{Region, MAX_RANK};
    use crate::expand::tensor_view;

    fn tensor(dtype: u32, shape: &[u32], strides: &[u32], arena_offset: u64) -> TensorDesc {
        let mut desc = TensorDesc {
            name: [0; 16],
            dtype: U32::new(dtype),
            rank: U32::new(shape.len() as u32),
            shape: [U32::new(0); MAX_RANK],
            strides: [U32::new(0); MAX_RANK],
            arena_offset: U64::new(arena_offset),
        };
        for d in 0..shape.len() {
            desc.shape[d] = U32::new(shape[d]);
            desc.strides[d] = U32::new(strides[d]);
        }
        desc
    }

    /// A view's fields (`WspTensorView` has no `PartialEq`).
    fn fields(v: &WspTensorView) -> (u64, u32, u32, u32, u32) {
        (v.addr, v.rows, v.cols, v.row_stride, v.dtype)
    }

    fn region(offset: [u32; MAX_RANK], extent: [u32; MAX_RANK]) -> Region {
        Region { offset, extent }
    }

    /// What a core gets from a record is the view the dispatcher wrote,
    /// though the record keeps only the address, the extents and the
    /// tensor (whose element type and row stride the view has).
    #[test]
    fn a_record_reads_back_the_launch_written() {
        // Four tensors of ranks 1 to 3, padded rows, both element types;
        // indices up to the last a table may declare.
        let mut tensors: Vec<TensorDesc> = (0..MAX_TENSORS)
            .map(|_| tensor(wsp_ffi::DTYPE_F32, &[1], &[1], 0))
            .collect();
        let picks = [65_535u32, 3, 65_534, 0];
        tensors[65_535] = tensor(wsp_ffi::DTYPE_F32, &[1000], &[1], 64);
        tensors[3] = tensor(wsp_ffi::DTYPE_I32, &[64, 100], &[128, 1], 4096);
        tensors[65_534] = tensor(wsp_ffi::DTYPE_F32, &[4, 32, 48], &[2048, 64, 1], 1 << 40);
        tensors[0] = tensor(wsp_ffi::DTYPE_F32, &[7, 5], &[5, 1], 8);
        let regions = [
            region([100, 0, 0, 0], [300, 1, 1, 1]),
            region([8, 36, 0, 0], [16, 64, 1, 1]),
            region([2, 16, 8, 0], [1, 16, 40, 1]),
            region([0, 0, 0, 0], [7, 5, 1, 1]),
        ];
        let mut args = WspKernelArgs {
            num_tensors: 4,
            num_scalars: 4,
            tensors: [NO_VIEW; MAX_TENSOR_ARGS],
            scalars: [u64::MAX, 0, 1 << 63, 42],
        };
        for (i, (&t, r)) in picks.iter().zip(&regions).enumerate() {
            args.tensors[i] = tensor_view(&tensors[t as usize], r, 0);
        }
        let records = Box::new(Records::new());
        let launch = Launch {
            kernel_id: u32::MAX,
            stream: MAX_STREAMS as u32,
            args,
            tensors: picks,
        };
        let task = 3 * TASK_WINDOW as u64 + 5;
        records.write(task, &launch);
        let base = 0x4000_0000;
        let read = records.read(task, base, &tensors);
        assert_eq!(read.kernel_id, u32::MAX);
        assert_eq!(records.kernel_id(task), u32::MAX);
        assert_eq!(read.stream, MAX_STREAMS as u32);
        assert_eq!(read.tensors, picks);
        assert_eq!((read.args.num_tensors, read.args.num_scalars), (4, 4));
        assert_eq!(read.args.scalars, args.scalars);
        for (i, (&t, r)) in picks.iter().zip(&regions).enumerate() {
            let expected = tensor_view(&tensors[t as usize], r, base);
            assert_eq!(fields(&read.args.tensors[i]), fields(&expected), "view {i}");
        }
        // The rank-1 view's rows are one row of its columns apart.
        assert_eq!(read.args.tensors[0].row_stride, 300);
        assert_eq!(read.args.tensors[1].row_stride, 128);
        assert_eq!(read.args.tensors[1].dtype, wsp_ffi::DTYPE_I32);

        // Fewer tensors and scalars: the rest are empty.
        let mut two = args;
        two.num_tensors = 2;
        two.num_scalars = 1;
        two.tensors[2..].fill(NO_VIEW);
        two.scalars[1..].fill(0);
        let launch = Launch {
            kernel_id: 9,
            stream: 0,
            args: two,
            tensors: [picks[0], picks[1], 0, 0],
        };
        records.write(task, &launch);
        let read = records.read(task, base, &tensors);
        assert_eq!((read.kernel_id, read.stream), (9, 0));
        assert_eq!((read.args.num_tensors, read.args.num_scalars), (2, 1));
        for v in &read.args.tensors[2..] {
            assert_eq!(fields(v), fields(&NO_VIEW));
        }
        assert_eq!(read.args.scalars, [u64::MAX, 0, 0, 0]);
        let expected = tensor_view(&tensors[3], &regions[1], base);
        assert_eq!(fields(&read.args.tensors[1]), fields(&expected));
    }
}
