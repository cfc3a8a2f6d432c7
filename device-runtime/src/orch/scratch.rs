//! Scratch tensors: intermediates whose storage the heap ring lends while
//! they are live, instead of arena bytes for the whole run.
//!
//! A table marks a tensor scratch with
//! [`SCRATCH_OFFSET`](crate::abi::SCRATCH_OFFSET) and its program declares
//! the heap ring (`HEAP`: the arena's last bytes). The dispatcher asks
//! [`ScratchHeap::bind`] before each task of a table with scratch tensors:
//!
//! - **First producer.** A task that writes a scratch tensor with no
//!   storage takes a block of the heap ring for it; the block's offset is
//!   the tensor's base until the block is given back, and every task's
//!   view of the tensor (its launch record) is built from it. A task that
//!   reads one with no storage is an error (nothing wrote it).
//! - **Last consumer.** A block returns when the tasks that use it have
//!   retired: for a tensor only the tasks section uses, after the last
//!   task of the section that names it (known from the table); for a
//!   tensor the program uses, after every task submitted before the
//!   program's `FREE` of it (its scope's end; [`ScratchHeap::free`]), or
//!   never before the run ends. Retirement is in task order, so "retired"
//!   is a single count.
//! - **Ring order.** Blocks are taken in submission order and the heap
//!   ring frees them in that order: a block whose tensor is dead waits
//!   until every older block is given back. A scratch tensor that lives
//!   across later ones therefore pins the ring behind it; give such
//!   long-lived intermediates arena storage.
//! - **Backpressure.** When the ring (or the block list, [`MAX_BLOCKS`])
//!   has no room, [`bind`](ScratchHeap::bind) returns [`Bind::Full`] and
//!   the submission waits for retirements (`HEAP_RING_FULL`). When nothing
//!   is in flight to retire, no room can come: the dispatcher ends the run
//!   with a report naming the tensor and the sizes, never a hang.

use super::heap_ring::{HeapBlock, HeapRing};
use super::TaskArg;
use crate::abi::program::{OP_ARG, OP_FREE};
use crate::abi::{Access, Problem, Table, MAX_SCRATCH};

/// Heap blocks held at once (live or dead and waiting for an older one):
/// two per scratch tensor. A fuller list stalls like a full ring.
pub const MAX_BLOCKS: usize = 2 * MAX_SCRATCH;

/// `dies_at` of a block whose tensor's scope has not ended.
const NEVER: u64 = u64::MAX;

#[derive(Clone, Copy, Debug)]
struct ScratchTensor {
    /// The table's tensor index.
    tensor: u32,
    /// Bytes from element 0 to one past the last element.
    len: u64,
    /// Its storage now: index into `blocks` (by sequence number).
    block: Option<u64>,
    /// Tasks-section tensors the program never names: the run's number of
    /// the task after the last one that names it.
    table_end: Option<u64>,
}

#[derive(Clone, Copy, Debug)]
struct Block {
    heap: HeapBlock,
    /// Which scratch tensor (index into `tensors`).
    owner: u8,
    /// Given back once this many tasks of the run have retired.
    dies_at: u64,
}

/// Why [`ScratchHeap::bind`] could not give a task's scratch tensors storage.
#[allow(missing_docs)] // Variant fields: see each variant's doc; their names say the rest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bind {
    /// The ring has no room for `tensor`'s `requested` bytes now.
    Full { tensor: u32, requested: u64 },
    /// The task reads `tensor`, which has no storage: nothing wrote it
    /// (since its scope began).
    ReadBeforeWrite { tensor: u32 },
}

/// The scratch tensors of one run and the heap ring that holds them.
#[derive(Clone, Debug)]
pub struct ScratchHeap {
    ring: HeapRing,
    /// Arena offset of the ring's byte 0.
    base: u64,
    tensors: heapless::Vec<ScratchTensor, MAX_SCRATCH>,
    /// Blocks in allocation order: sequence numbers `first .. next`.
    blocks: [Block; MAX_BLOCKS],
    first: u64,
    next: u64,
    high_water: u64,
    /// Bytes of the blocks given so far ([`ScratchHeap::taken_bytes`]).
    taken: u64,
}

const NO_BLOCK: Block = Block {
    heap: HeapBlock::EMPTY,
    owner: 0,
    dies_at: NEVER,
};

impl ScratchHeap {
    /// A ring of `capacity` bytes at arena offset `base`, with no tensors.
    pub fn new(base: u64, capacity: u64) -> Self {
        ScratchHeap {
            ring: HeapRing::new(capacity),
            base,
            tensors: heapless::Vec::new(),
            blocks: [NO_BLOCK; MAX_BLOCKS],
            first: 0,
            next: 0,
            high_water: 0,
            taken: 0,
        }
    }

    /// The scratch tensors of a validated table and its heap ring. The
    /// run's task 0 is the table's task 0.
    pub fn of_table(table: &Table<'_>) -> Self {
        let (base, bytes) = table.heap();
        let mut heap = ScratchHeap::new(base, bytes);
        for (i, t) in table.tensors().iter().enumerate() {
            if !t.is_scratch() {
                continue;
            }
            let i = i as u32;
            let in_program = table
                .program()
                .iter()
                .any(|p| matches!(p.op, OP_ARG | OP_FREE) && p.imm.get() == i);
            let table_end = (!in_program)
                .then(|| {
                    table
                        .tasks()
                        .iter()
                        .rposition(|d| table.task_args(d).iter().any(|a| a.tensor.get() == i))
                        .map(|last| last as u64 + 1)
                })
                .flatten();
            let len = Table::tensor_len(t).unwrap_or(u64::MAX);
            // Validation caps the count at MAX_SCRATCH.
            let _ = heap.declare(i, len, table_end);
        }
        heap
    }

    /// Declares scratch tensor `tensor` of `len` bytes; `table_end`: the
    /// number of tasks after which it is dead, if known now. Past
    /// [`MAX_SCRATCH`] tensors, [`Problem::TooManyScratch`].
    pub fn declare(
        &mut self,
        tensor: u32,
        len: u64,
        table_end: Option<u64>,
    ) -> Result<(), Problem> {
        self.tensors
            .push(ScratchTensor {
                tensor,
                len,
                block: None,
                table_end,
            })
            .map_err(|_| Problem::TooManyScratch {
                max: MAX_SCRATCH as u32,
            })
    }

    /// Whether the run has scratch tensors at all.
    #[inline]
    pub fn is_active(&self) -> bool {
        !self.tensors.is_empty()
    }

    /// The ring's size in bytes.
    pub fn capacity(&self) -> u64 {
        self.ring.capacity()
    }

    /// Bytes the ring holds now (live and dead-but-pinned blocks, wrap gaps).
    pub fn used(&self) -> u64 {
        self.ring.used()
    }

    /// The most bytes the ring held at once.
    pub fn high_water(&self) -> u64 {
        self.high_water
    }

    /// Bytes the scratch tensors would take as arena tensors, each rounded
    /// up to the heap's 64-byte alignment.
    pub fn declared_bytes(&self) -> u64 {
        self.tensors.iter().map(|t| t.len.div_ceil(64) * 64).sum()
    }

    /// Bytes of storage the run's scratch scopes took, each rounded up to
    /// 64 bytes: a tensor's size once per scope (its first write, or the
    /// first after a `FREE`), so a tensor reused scope after scope counts
    /// each time. What the scopes would take as arena tensors of their
    /// own; [`ScratchHeap::declared_bytes`] when each tensor has one scope.
    pub fn taken_bytes(&self) -> u64 {
        self.taken
    }

    /// Scratch tensors that hold storage now.
    pub fn live(&self) -> u32 {
        self.tensors.iter().filter(|t| t.block.is_some()).count() as u32
    }

    /// The tensor whose block is the oldest the ring holds (the one every
    /// newer block waits behind), if any.
    pub fn oldest(&self) -> Option<u32> {
        (self.first < self.next).then(|| {
            let b = &self.blocks[(self.first % MAX_BLOCKS as u64) as usize];
            self.tensors[b.owner as usize].tensor
        })
    }

    fn index(&self, tensor: u32) -> Option<usize> {
        self.tensors.iter().position(|t| t.tensor == tensor)
    }

    /// Whether `tensor` is a scratch tensor of the run.
    pub fn is_scratch(&self, tensor: u32) -> bool {
        self.index(tensor).is_some()
    }

    /// Gives back, in allocation order, the blocks whose tensors died
    /// before `retired` tasks of the run had retired.
    pub fn reclaim(&mut self, retired: u64) {
        while self.first < self.next {
            let b = self.blocks[(self.first % MAX_BLOCKS as u64) as usize];
            if b.dies_at > retired {
                break;
            }
            self.ring.free(b.heap);
            self.first += 1;
        }
    }

    /// Gives storage to the scratch tensors of `args` that a task (the
    /// run's task `task`, `retired` tasks having retired) writes and that
    /// have none; checks that those it reads have some. On [`Bind::Full`]
    /// the tensors bound before it keep their storage: a retry finds them
    /// bound.
    pub fn bind(&mut self, args: &[TaskArg], task: u64, retired: u64) -> Result<(), Bind> {
        self.reclaim(retired);
        for arg in args {
            let Some(i) = self.index(arg.tensor) else {
                continue;
            };
            let t = self.tensors[i];
            if t.block.is_some() {
                continue;
            }
            if !arg.access.contains(Access::WRITE) {
                return Err(Bind::ReadBeforeWrite { tensor: t.tensor });
            }
            let full = Bind::Full {
                tensor: t.tensor,
                requested: t.len.div_ceil(64) * 64,
            };
            if self.next - self.first == MAX_BLOCKS as u64 {
                return Err(full);
            }
            let heap = self.ring.alloc(t.len).map_err(|_| full)?;
            // A tensors-section tensor's end is known; it is never before
            // its first writer.
            let dies_at = t.table_end.map_or(NEVER, |end| end.max(task + 1));
            self.blocks[(self.next % MAX_BLOCKS as u64) as usize] = Block {
                heap,
                owner: i as u8,
                dies_at,
            };
            self.tensors[i].block = Some(self.next);
            self.next += 1;
            self.high_water = self.high_water.max(self.ring.used());
            self.taken += t.len.div_ceil(64) * 64;
        }
        Ok(())
    }

    /// Ends `tensor`'s scope with `submitted` tasks of the run submitted:
    /// its storage returns once they have all retired (and every older
    /// block has returned); a later write takes new storage. A tensor
    /// without storage (or not scratch) is left alone.
    pub fn free(&mut self, tensor: u32, submitted: u64) {
        if let Some(i) = self.index(tensor) {
            if let Some(seq) = self.tensors[i].block.take() {
                self.blocks[(seq % MAX_BLOCKS as u64) as usize].dies_at = submitted;
            }
        }
    }

    /// The arena offset of `tensor`'s element 0 now, if it is a scratch
    /// tensor with storage.
    pub fn base_of(&self, tensor: u32) -> Option<u64> {
        let t = &self.tensors[self.index(tensor)?];
        let seq = t.block?;
        Some(self.base + self.blocks[(seq % MAX_BLOCKS as u64) as usize].heap.offset)
    }
}

/// Why a run with scratch tensors ended: what the task needed and what
/// the heap ring held.
#[allow(missing_docs)] // Variant fields: see each variant's doc; their names say the rest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScratchError {
    /// Task `task` writes scratch tensor `tensor` (`name`), which needs
    /// `requested` bytes of the heap ring, but the ring holds `used` of its
    /// `capacity` bytes for `live` live scratch tensors (the oldest block:
    /// tensor `oldest`'s) and no task is in flight whose retirement could
    /// give any back: the scope needs more than the ring holds.
    DoesNotFit {
        task: u32,
        tensor: u32,
        name: [u8; 16],
        requested: u64,
        used: u64,
        capacity: u64,
        live: u32,
        oldest: Option<u32>,
    },
    /// Task `task` reads scratch tensor `tensor` (`name`), which no task
    /// wrote since its scope began.
    ReadBeforeWrite {
        task: u32,
        tensor: u32,
        name: [u8; 16],
    },
}

/// A tensor name as text (NUL padding dropped; `?` if not UTF-8).
pub fn name_str(name: &[u8; 16]) -> &str {
    let len = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    core::str::from_utf8(&name[..len]).unwrap_or("?")
}

impl core::fmt::Display for ScratchError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match *self {
            ScratchError::DoesNotFit {
                task,
                tensor,
                ref name,
                requested,
                used,
                capacity,
                live,
                oldest,
            } => {
                write!(
                    f,
                    "heap ring deadlock: task {task} needs {requested} bytes for scratch tensor {tensor} `{}`, \
                     but the heap ring holds {used} of its {capacity} bytes for {live} live scratch tensors",
                    name_str(name)
                )?;
                if let Some(o) = oldest {
                    write!(f, " (the oldest block: tensor {o}'s)")?;
                }
                f.write_str(
                    " and no task in flight can give any back: enlarge HEAP, FREE scratch tensors \
                     sooner, or give long-lived ones arena storage",
                )
            }
            ScratchError::ReadBeforeWrite { task, tensor, ref name } => write!(
                f,
                "task {task} reads scratch tensor {tensor} `{}`, which no task wrote since its scope began",
                name_str(name)
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::Region;

    fn arg(tensor: u32, access: Access) -> TaskArg {
        TaskArg {
            tensor,
            region: Region {
                offset: [0; 4],
                extent: [1; 4],
            },
            access,
        }
    }
    const W: Access = Access::WRITE;
    const R: Access = Access::READ;

    #[test]
    fn storage_is_taken_at_the_first_producer_and_returned_after_the_last_consumer() {
        // Tensor 7 (1000 bytes): written by task 2, last read by task 4.
        let mut h = ScratchHeap::new(4096, 2048);
        h.declare(7, 1000, Some(5)).unwrap();
        assert_eq!(h.base_of(7), None, "no storage before its first producer");
        h.bind(&[arg(1, R)], 0, 0).unwrap();
        assert_eq!(h.used(), 0, "arena tensors take nothing");
        h.bind(&[arg(7, W)], 2, 0).unwrap();
        assert_eq!(h.base_of(7), Some(4096), "the ring's first block");
        assert_eq!(h.used(), 1024);
        h.bind(&[arg(7, R)], 4, 3).unwrap();
        h.reclaim(4);
        assert_eq!(h.used(), 1024, "task 4 (the last reader) has not retired");
        h.reclaim(5);
        assert_eq!(h.used(), 0, "returned when task 4 retired");
        assert_eq!(h.high_water(), 1024);
    }

    #[test]
    fn reading_before_any_write_is_an_error() {
        let mut h = ScratchHeap::new(0, 1024);
        h.declare(3, 64, None).unwrap();
        assert_eq!(
            h.bind(&[arg(3, R)], 0, 0),
            Err(Bind::ReadBeforeWrite { tensor: 3 })
        );
        h.bind(&[arg(3, W)], 1, 0).unwrap();
        h.free(3, 2);
        assert_eq!(
            h.bind(&[arg(3, R)], 2, 0),
            Err(Bind::ReadBeforeWrite { tensor: 3 }),
            "after its FREE, the old contents are gone"
        );
    }

    #[test]
    fn a_full_ring_stalls_until_the_older_block_returns_in_order() {
        // 1024 bytes hold two 512-byte tensors; a third waits.
        let mut h = ScratchHeap::new(0, 1024);
        for t in 0..3 {
            h.declare(t, 512, None).unwrap();
        }
        h.bind(&[arg(0, W)], 0, 0).unwrap();
        h.bind(&[arg(1, W)], 1, 0).unwrap();
        let full = Err(Bind::Full {
            tensor: 2,
            requested: 512,
        });
        assert_eq!(h.bind(&[arg(2, W)], 2, 0), full);
        // Tensor 1 dies first, but tensor 0's older block pins the ring.
        h.free(1, 2);
        assert_eq!(
            h.bind(&[arg(2, W)], 2, 2),
            full,
            "ring order: 1 waits behind 0"
        );
        assert_eq!(h.oldest(), Some(0));
        h.free(0, 2);
        h.bind(&[arg(2, W)], 2, 2).unwrap();
        assert_eq!(h.base_of(2), Some(0), "both returned: the ring starts over");
        assert_eq!(h.high_water(), 1024);
    }

    #[test]
    fn blocks_wrap_around_the_ring() {
        let mut h = ScratchHeap::new(100_000, 1024);
        h.declare(0, 384, None).unwrap();
        h.declare(1, 384, None).unwrap();
        h.declare(2, 320, None).unwrap();
        h.bind(&[arg(0, W)], 0, 0).unwrap(); // [0, 384)
        h.bind(&[arg(1, W)], 1, 0).unwrap(); // [384, 768)
        h.free(0, 2);
        // 256 bytes left at the end: tensor 2 (320) wraps to 0 once 0 is back.
        h.bind(&[arg(2, W)], 2, 2).unwrap();
        assert_eq!(h.base_of(2), Some(100_000));
        assert_eq!(h.base_of(1), Some(100_000 + 384));
    }

    #[test]
    fn a_retry_after_a_stall_keeps_what_it_bound() {
        let mut h = ScratchHeap::new(0, 1024);
        h.declare(0, 512, None).unwrap();
        h.declare(1, 1024, None).unwrap();
        let args = [arg(0, W), arg(1, W)];
        assert_eq!(
            h.bind(&args, 0, 0),
            Err(Bind::Full {
                tensor: 1,
                requested: 1024
            })
        );
        assert_eq!(h.base_of(0), Some(0), "tensor 0 keeps its block");
        assert_eq!(h.live(), 1);
        assert_eq!(h.declared_bytes(), 1536);
    }
}
