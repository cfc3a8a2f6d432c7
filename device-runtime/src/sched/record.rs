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

use wsp_ffi::{WspKernelArgs, WspTensorView};

use crate::abi::{MAX_SCALARS, MAX_TENSOR_ARGS, TASK_WINDOW};
use crate::expand::NO_VIEW;
use crate::sync::{AtomicU64, Ordering};

/// Words of one record: kernel and stream, counts, three per tensor view,
/// one per scalar.
const WORDS: usize = 2 + 3 * MAX_TENSOR_ARGS + MAX_SCALARS;

/// A decoded record.
#[derive(Clone, Copy, Debug)]
pub struct Launch {
    /// The kernel.
    pub kernel_id: u32,
    /// Its stream (0 for none).
    pub stream: u32,
    /// Tensor addresses are arena offsets until [`Records::read`] adds the base.
    pub args: WspKernelArgs,
}

/// The records of the task window (144 bytes a task: about 290 KiB at the
/// default window; part of [`super::Queues`]).
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
        words[0] = launch.kernel_id as u64 | (launch.stream as u64) << 32;
        words[1] = args.num_tensors as u64 | (args.num_scalars as u64) << 32;
        for (i, v) in args.tensors.iter().enumerate() {
            words[2 + 3 * i] = v.addr;
            words[3 + 3 * i] = v.rows as u64 | (v.cols as u64) << 32;
            words[4 + 3 * i] = v.row_stride as u64 | (v.dtype as u64) << 32;
        }
        words[2 + 3 * MAX_TENSOR_ARGS..].copy_from_slice(&args.scalars);
        for (w, v) in slot.iter().zip(words) {
            w.store(v, Ordering::Relaxed);
        }
    }

    /// Reads the record of task `task`, with tensor addresses rebased on
    /// `arena_base`.
    pub fn read(&self, task: u64, arena_base: u64) -> Launch {
        let slot = &self.slots[(task % TASK_WINDOW as u64) as usize];
        let w = |i: usize| slot[i].load(Ordering::Relaxed);
        let counts = w(1);
        let mut args = WspKernelArgs {
            num_tensors: counts as u32,
            num_scalars: (counts >> 32) as u32,
            tensors: [NO_VIEW; MAX_TENSOR_ARGS],
            scalars: [0; MAX_SCALARS],
        };
        for (i, v) in args.tensors.iter_mut().enumerate() {
            if i >= args.num_tensors as usize {
                break;
            }
            let (shape, layout) = (w(3 + 3 * i), w(4 + 3 * i));
            *v = WspTensorView {
                addr: arena_base + w(2 + 3 * i),
                rows: shape as u32,
                cols: (shape >> 32) as u32,
                row_stride: layout as u32,
                dtype: (layout >> 32) as u32,
            };
        }
        for (i, s) in args.scalars.iter_mut().enumerate() {
            *s = w(2 + 3 * MAX_TENSOR_ARGS + i);
        }
        let head = w(0);
        Launch {
            kernel_id: head as u32,
            stream: (head >> 32) as u32,
            args,
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
