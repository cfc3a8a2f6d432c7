//! Bounded orchestration: turns a stream of task submissions into a
//! dependency graph in statically sized memory, with backpressure instead of
//! failure and a report instead of a hang.
//!
//! One thread owns the orchestrator: it submits tasks and infers their
//! dependencies. Completions reach it in one of two ways, chosen by how
//! tasks are submitted:
//! - owner completes ([`Orchestrator::submit`], [`Orchestrator::submit_on`]):
//!   the owner also receives every completion and calls
//!   [`Orchestrator::complete`], which releases the task's consumers from
//!   plain fan-in counters and DepList fan-out lists; deterministic for a
//!   given event order, for single-threaded embedders;
//! - threads release ([`Orchestrator::submit_linked`]): edges go into a
//!   [`ReleaseGraph`] of atomic fan-in counters and fan-out lists, whose
//!   consumers the thread that sees a completion releases itself; the
//!   owner only learns of the completion later ([`Orchestrator::finished`])
//!   to retire the task. The scheduler runs tables this way, so that no
//!   completion waits for the submitting thread before its dependents run.
//!
//! Resources, each with a documented capacity:
//! - task ring (`TASKS` slots, the task window): allocated and retired in order;
//! - TensorMap (`TMAP` entries, [`tensor_map::BUCKETS`] buckets): dependency inference;
//! - DepList pool (`DEPS` nodes): fan-out edges (owner completes), or the
//!   release graph's edge ring (threads release; reclaimed, like the
//!   TensorMap, as the tasks that own the edges retire);
//! - heap ring (a byte capacity given at construction): intermediate buffers.
//!
//! A task's slot, heap block and TensorMap entries are reclaimed together
//! when it and every older task have completed and no open scope holds it
//! (the TensorMap and the heap are rings reclaimed in that order);
//! its DepList nodes go back to the pool as soon as it completes, since its
//! consumers are released then.
//!
//! Streams and events ([`stream`]): a task submitted on a stream
//! ([`Orchestrator::submit_on`]) becomes ready only after the stream's
//! previous task was issued to a core ([`Orchestrator::issued`]), so a
//! stream issues in order but its tasks may overlap; an event recorded on a
//! stream ([`Orchestrator::record_event`]) stands for the stream's tasks so
//! far, and a stream that waits for it ([`Orchestrator::wait_event`]) holds
//! its next task until they have all completed. Both combine with the
//! inferred tensor dependencies.
//!
//! When a resource is full, [`Orchestrator::submit`] returns
//! [`SubmitError::Stall`] and changes nothing: the caller processes
//! completions and submits again. When the caller finds it cannot progress,
//! [`Orchestrator::check_progress`] proves (not guesses from a spin count)
//! whether progress is impossible and returns a [`DeadlockReport`].

pub mod deadlock;
pub mod dep_pool;
pub mod heap_ring;
pub mod release;
pub mod scratch;
pub mod stall;
pub mod stream;
pub mod tensor_map;

use core::fmt;

use wsp_ffi::CoreKind;

use crate::abi::{Access, Region, MAX_TENSOR_ARGS};
pub use deadlock::{BlockedTask, DeadlockCause, DeadlockReport, Occupancy, MAX_SCOPE_DEPTH};
use deadlock::{REPORTED_PRODUCERS, REPORTED_TASKS};
use dep_pool::{DepPool, NIL};
pub use heap_ring::{HeapBlock, HeapError, HeapRing};
pub use release::ReleaseGraph;
pub use stall::{ResourceStats, StallReason, StallStats, STALL_REASONS};
use stream::{is_stream, Streams};
pub use stream::{EventId, StreamId};
use tensor_map::{Place, TensorMap, Visitor};

#[cfg(test)]
mod tests;

/// A task's number: submission order, from 0. Its slot is `id % TASKS`.
pub type TaskId = u64;

/// The kernel a task calls and the kind of core it needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelRef {
    /// The kernel's id in the registry.
    pub id: u32,
    /// The kind of core it runs on.
    pub kind: CoreKind,
}

/// One tensor argument: a region of the tensor with key `tensor`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TaskArg {
    /// The tensor, by the caller's number (a table's tensor index).
    pub tensor: u32,
    /// The part of the tensor the task touches.
    pub region: Region,
    /// Whether the task reads it, writes it or both.
    pub access: Access,
}

/// Where a task is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaskState {
    /// Waiting for producers.
    Pending,
    /// In a ready list.
    Ready,
    /// Handed out by [`Orchestrator::pop_ready`].
    Running,
    /// Reported issued to a core ([`Orchestrator::issued`]): the next task
    /// of its stream may become ready.
    Issued,
    /// Finished; retires when everything older has and no scope holds it.
    Completed,
}

/// A task handed to the caller to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadyTask {
    /// Its id.
    pub id: TaskId,
    /// The kernel it runs.
    pub kernel: KernelRef,
    /// The caller's own value given at submission (e.g. a table index).
    pub tag: u64,
    /// Its heap ring block (length 0 if it asked for none).
    pub heap: HeapBlock,
}

/// A submission the orchestrator refuses for good.
#[allow(missing_docs)] // Variant fields: see each variant's doc; their names say the rest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Invalid {
    /// More tensor arguments (`count`) than a task carries (`max`).
    TooManyArgs { count: usize, max: usize },
    /// An explicit dependency on a task that was never submitted.
    UnknownTask { id: TaskId, next: TaskId },
    /// Argument `index` writes a region overlapping argument `other`.
    ArgsOverlap { index: usize, other: usize },
    /// A stream number outside 1 ..= [`MAX_STREAMS`](crate::abi::MAX_STREAMS).
    NoSuchStream { stream: StreamId },
}

/// Why [`Orchestrator::submit`] did not submit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SubmitError {
    /// A resource is full; complete tasks and submit again.
    Stall(StallReason),
    /// Waiting cannot help. [`Orchestrator::report`] turns the cause into a
    /// full report (kept out of this type so that submission results stay
    /// small on the hot path).
    Deadlock(DeadlockCause),
    /// The task is malformed; submitting it again cannot help.
    Invalid(Invalid),
}

/// Misuse of scopes or completions.
#[allow(missing_docs)] // Variant fields: see each variant's doc; their names say the rest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UsageError {
    /// More nested scopes than `max`.
    ScopeTooDeep { max: usize },
    /// `scope_end` without an open scope.
    NoOpenScope,
    /// `issued` or `complete` for a task that is not running.
    NotRunning { id: TaskId },
    /// A stream number outside 1 ..= [`MAX_STREAMS`](crate::abi::MAX_STREAMS).
    NoSuchStream { stream: StreamId },
    /// An event number outside 0 .. [`MAX_EVENTS`](crate::abi::MAX_EVENTS).
    NoSuchEvent { event: EventId },
    /// A wait on an event that was never recorded.
    EventNotRecorded { event: EventId },
    /// [`Orchestrator::finished`] for a task submitted with
    /// [`Orchestrator::submit`] or [`Orchestrator::submit_on`], which has
    /// consumers or a stream successor to release: it needs
    /// [`Orchestrator::complete`] (and `issued`).
    OwnerCompletes { id: TaskId },
}

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            UsageError::ScopeTooDeep { max } => write!(f, "more than {max} nested scopes"),
            UsageError::NoOpenScope => f.write_str("scope_end without an open scope"),
            UsageError::NotRunning { id } => write!(f, "task {id} is not running"),
            UsageError::NoSuchStream { stream } => write!(
                f,
                "stream {stream}; streams are 1 to {}",
                crate::abi::MAX_STREAMS
            ),
            UsageError::NoSuchEvent { event } => write!(
                f,
                "event {event}; events are 0 to {}",
                crate::abi::MAX_EVENTS - 1
            ),
            UsageError::EventNotRecorded { event } => {
                write!(f, "wait on event {event}, which was never recorded")
            }
            UsageError::OwnerCompletes { id } => write!(
                f,
                "finished for task {id}, which was submitted without a release graph and has tasks to release: report it with complete"
            ),
        }
    }
}

impl fmt::Display for SubmitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SubmitError::Stall(r) => write!(f, "stalled: {r}"),
            SubmitError::Deadlock(cause) => write!(f, "deadlock: {cause}"),
            SubmitError::Invalid(Invalid::TooManyArgs { count, max }) => {
                write!(f, "{count} tensor arguments, at most {max}")
            }
            SubmitError::Invalid(Invalid::UnknownTask { id, next }) => {
                write!(
                    f,
                    "dependency on task {id}, but only tasks 0..{next} were submitted"
                )
            }
            SubmitError::Invalid(Invalid::ArgsOverlap { index, other }) => {
                write!(
                    f,
                    "argument {index} writes a region overlapping argument {other}"
                )
            }
            SubmitError::Invalid(Invalid::NoSuchStream { stream }) => write!(
                f,
                "stream {stream}; streams are 1 to {}",
                crate::abi::MAX_STREAMS
            ),
        }
    }
}

/// Why [`Orchestrator::set_window`] refused a task window.
#[allow(missing_docs)] // Variant fields: see each variant's doc; their names say the rest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WindowError {
    /// A window of `tasks` tasks, outside 1 ..= `max` (the ring's `TASKS`).
    OutOfRange { tasks: u64, max: u64 },
    /// `in_flight` tasks are submitted and not retired: the window changes
    /// only between runs, once every task has retired.
    InFlight { in_flight: u64 },
}

impl fmt::Display for WindowError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            WindowError::OutOfRange { tasks, max } => {
                write!(f, "task window {tasks}; 1 to {max} tasks are supported")
            }
            WindowError::InFlight { in_flight } => write!(
                f,
                "the task window changes only between runs, and {in_flight} tasks are in flight"
            ),
        }
    }
}

/// A task's slot: 64 bytes a task of the window. Task numbers that the
/// window bounds are kept narrow: the next task of a stream (and the
/// tasks of a ready ring) as a slot index (the slot holds the task's full id: such a task is live),
/// ring positions as their low 32 bits (restored from the ring's current
/// position, at most the ring's capacity ahead; see [`restore`]).
#[derive(Clone, Copy, Debug)]
struct Slot {
    id: TaskId,
    tag: u64,
    heap: HeapBlock,
    /// The kernel's id ([`KernelRef::id`]; its kind is `vector`).
    kernel_id: u32,
    /// Unfinished producers, plus one while the task is being wired.
    fanin: u32,
    /// Head of the fan-out list in the DepList pool: the edges after
    /// [`Slot::consumer`]'s, newest first.
    fanout: u32,
    /// The low 32 bits of the last dependency pass that met this task as a
    /// producer (see [`Orchestrator::next_mark`]).
    marked_by: u32,
    /// The low 32 bits of the TensorMap position after this task's
    /// entries: reclaimed up to it when the task retires.
    tmap_end: u32,
    /// The low 32 bits of the release-graph edge position after this
    /// task's edges: reclaimed up to it when the task retires
    /// ([`Orchestrator::submit_linked`]).
    edges_end: u32,
    /// Slot of the next task of its stream, held back until this one is
    /// issued ([`NO_SLOT`]: none).
    stream_next: u16,
    /// Slot of the task of its first fan-out edge ([`NO_SLOT`]: none),
    /// kept here rather than in the DepList pool: most producers of a
    /// tiled workload have one consumer (the next step of a chain), which
    /// then takes no node to link or to release.
    consumer: u16,
    state: TaskState,
    /// Its kernel runs on vector cores (else cube cores).
    vector: bool,
    /// Its stream (0: none; at most [`MAX_STREAMS`](crate::abi::MAX_STREAMS)).
    stream: u8,
}
const _: () = assert!(core::mem::size_of::<Slot>() == 64);
const _: () = assert!(crate::abi::MAX_STREAMS <= u8::MAX as usize);

impl Slot {
    fn kernel(&self) -> KernelRef {
        KernelRef {
            id: self.kernel_id,
            kind: if self.vector {
                CoreKind::Vector
            } else {
                CoreKind::Cube
            },
        }
    }
}

const NONE: TaskId = u64::MAX;

/// The share of the task window that a stalled submission waits to be
/// free before it is tried again ([`Orchestrator::retry_now`]): a 64th,
/// 64 tasks of the default window of 4,096 (under 2% of the lookahead);
/// none below a window of 64.
pub const REFILL_SHARE: u64 = 64;

/// No slot ([`Slot::stream_next`], [`Slot::consumer`]): slot indices are
/// below `TASKS`, at most 2^15.
const NO_SLOT: u16 = u16::MAX;

/// The full position of a ring whose current position is `now`, from its
/// low 32 bits `low`, for a position at most 2^32 - 1 behind `now` (the
/// ring's capacity bounds how far behind it can be).
#[inline(always)]
fn restore(now: u64, low: u32) -> u64 {
    now - (now as u32).wrapping_sub(low) as u64
}

const FREE_SLOT: Slot = Slot {
    id: NONE,
    tag: 0,
    heap: HeapBlock::EMPTY,
    kernel_id: 0,
    fanin: 0,
    fanout: NIL,
    marked_by: 0,
    tmap_end: 0,
    edges_end: 0,
    stream_next: NO_SLOT,
    consumer: NO_SLOT,
    state: TaskState::Completed,
    vector: true,
    stream: 0,
};

/// The ready tasks of each core kind (index: [`CoreKind`] as a number),
/// oldest first: their slots in a ring of `TASKS` per kind (a task is in
/// at most one ready list, and at most `TASKS` are live, so a ring cannot
/// overflow). A ring rather than a list linked through the slots: a push
/// is a store and a bump, a pop a load and a bump, with no slot touched
/// but to read the popped task's id (2 bytes a task of the window per
/// kind). The kinds' counters sit in arrays of their own, so that a kind
/// known only at run time indexes them by scaling, not by the size of a
/// whole ring.
struct ReadyRings<const TASKS: usize> {
    slots: [[u16; TASKS]; 2],
    /// Pops so far (the oldest ready task of kind `k` is at
    /// `head[k] % TASKS`).
    head: [u32; 2],
    /// Pushes so far.
    tail: [u32; 2],
}

impl<const TASKS: usize> ReadyRings<TASKS> {
    const EMPTY: Self = ReadyRings {
        slots: [[0; TASKS]; 2],
        head: [0; 2],
        tail: [0; 2],
    };

    /// Tasks in the ring of kind `kind`.
    #[inline(always)]
    fn len(&self, kind: usize) -> u64 {
        self.tail[kind % 2].wrapping_sub(self.head[kind % 2]) as u64
    }

    #[inline(always)]
    fn push(&mut self, kind: usize, slot: usize) {
        debug_assert!(
            self.len(kind) < TASKS as u64,
            "at most TASKS tasks are live"
        );
        let tail = &mut self.tail[kind % 2];
        self.slots[kind % 2][*tail as usize % TASKS] = slot as u16;
        *tail = tail.wrapping_add(1);
    }

    /// The oldest task's slot of kind `kind`.
    #[inline(always)]
    fn pop(&mut self, kind: usize) -> Option<usize> {
        let head = &mut self.head[kind % 2];
        if *head == self.tail[kind % 2] {
            return None;
        }
        let slot = self.slots[kind % 2][*head as usize % TASKS] as usize;
        *head = head.wrapping_add(1);
        Some(slot)
    }
}

#[derive(Clone, Copy, Debug)]
struct Scope {
    name: &'static str,
    first: TaskId,
}

/// The orchestrator. `TASKS` (the task window) must be a power of two.
/// Defaults used by the runtime: see [`exec`](crate::exec).
pub struct Orchestrator<const TASKS: usize, const TMAP: usize, const DEPS: usize> {
    slots: [Slot; TASKS],
    /// Oldest task not retired.
    head: TaskId,
    /// Id of the next submission.
    next: TaskId,
    tmap: TensorMap<TMAP>,
    deps: DepPool<DEPS>,
    heap: HeapRing,
    ready: ReadyRings<TASKS>,
    scopes: [Scope; MAX_SCOPE_DEPTH],
    depth: usize,
    /// The first task the outermost open scope holds ([`NONE`] while no
    /// scope is open): the tasks held are exactly those from it on, since
    /// every task submitted inside the outermost scope is held until that
    /// scope ends, and an inner scope's end holds its tasks on for the
    /// enclosing one. Retirement stops at it; a slot needs no flag.
    held_from: TaskId,
    stats: StallStats,
    /// Counts dependency passes; each pass marks producers with its
    /// number's low 32 bits ([`Orchestrator::next_mark`]).
    pass: u64,
    /// The first producers the last dependency pass found (all of them when
    /// it found no more than this holds), so that committing needs no second walk.
    found: [TaskId; FOUND],
    streams: Streams,
    /// Tasks that may be in flight at once: `TASKS`, or fewer
    /// ([`Orchestrator::set_window`]).
    window: u64,
    /// Release-graph edges allocated so far (a ring position).
    edge_alloc: u64,
    /// A dependency pass's held conflicts (see `Wiring::held`), kept here
    /// so that a pass does not clear it.
    held: [TaskId; HELD],
    /// Release-graph edges reclaimed so far: those of retired tasks.
    edge_free: u64,
    /// `next` when the high-water marks last took the task ring's,
    /// TensorMap's and edges' use ([`Orchestrator::take_use`]).
    sampled: TaskId,
}

impl<const TASKS: usize, const TMAP: usize, const DEPS: usize> Orchestrator<TASKS, TMAP, DEPS> {
    const POWER_OF_TWO: () = assert!(
        TASKS.is_power_of_two(),
        "the task window must be a power of two"
    );
    /// Slots name slots in 16 bits ([`NO_SLOT`] is none), and ring
    /// positions in 32 ([`restore`]).
    const NARROW: () = assert!(
        TASKS <= 1 << 15 && TMAP <= u32::MAX as usize,
        "the task window is at most 2^15, the TensorMap below 2^32 entries"
    );

    /// An empty orchestrator whose heap ring manages `heap_bytes` bytes.
    pub const fn new(heap_bytes: u64) -> Self {
        #[allow(clippy::let_unit_value)]
        let _ = Self::POWER_OF_TWO;
        #[allow(clippy::let_unit_value)]
        let _ = Self::NARROW;
        Orchestrator {
            slots: [FREE_SLOT; TASKS],
            head: 0,
            next: 0,
            tmap: TensorMap::new(),
            deps: DepPool::new(),
            heap: HeapRing::new(heap_bytes),
            ready: ReadyRings::EMPTY,
            scopes: [Scope { name: "", first: 0 }; MAX_SCOPE_DEPTH],
            depth: 0,
            held_from: NONE,
            stats: StallStats::new([TASKS as u64, TMAP as u64, DEPS as u64, heap_bytes, 0, 0, 0]),
            pass: 0,
            found: [0; FOUND],
            streams: Streams::new(),
            window: TASKS as u64,
            edge_alloc: 0,
            edge_free: 0,
            held: [0; HELD],
            sampled: 0,
        }
    }

    /// Makes a drained orchestrator behave as [`Orchestrator::new`] with
    /// its heap capacity, without rewriting its large arrays: the next
    /// run submits from id 0 and sees the same ids, edges, stalls and
    /// statistics as on a new one. `false`, changing nothing, if tasks are
    /// in flight (a run that ended early): [`Orchestrator::reset`] then.
    ///
    /// A new orchestrator is over 600 KiB at the default window, and
    /// building one (on the host: on the stack, then copied into its box)
    /// was most of a small run's time. What is not rewritten is never read
    /// before a submission writes it:
    /// - a task slot is read for ids below the next id only, and every id
    ///   a run submits writes its slot first (ids start at 0 again, and a
    ///   retired task's slot says `Completed`, as a new slot does);
    /// - a TensorMap entry is reached only through its bucket chains,
    ///   which are emptied ([`TensorMap::recycle`]);
    /// - the DepList pool has every node free (each retired task freed its
    ///   fan-out); which free node a push takes is not observable;
    /// - slot marks are compared with the pass count, which keeps growing
    ///   (restarting it could match a mark an old pass left).
    pub fn recycle(&mut self) -> bool {
        if !self.is_drained() {
            return false;
        }
        debug_assert!(
            self.deps.used() == 0,
            "a drained orchestrator holds no edge"
        );
        self.reset();
        true
    }

    /// Makes the orchestrator behave as [`Orchestrator::new`] with its
    /// heap capacity, whatever a run left in it (tasks in flight, ready
    /// or held by a scope, edges in the DepList pool: a run that ended
    /// early), in place: nothing of its size is built, so this is how a
    /// thread with a small stack (an AICPU thread) starts over after a
    /// failed run. As [`Orchestrator::recycle`], plus what only a run that
    /// ended early leaves behind: the slots of the tasks it left in flight
    /// are made retired (`Completed`, with no fan-out, no stream
    /// successor and no scope holding them, so that nothing of theirs is
    /// released, reported running or taken for a scope's), and the DepList pool's free list is rebuilt if any node
    /// was in use. Costs a write per task left in flight and, then, per
    /// DepList node; a drained orchestrator pays what `recycle` does.
    pub fn reset(&mut self) {
        for id in self.head..self.next {
            let slot = self.slot_mut(id);
            slot.state = TaskState::Completed;
            slot.fanout = NIL;
            slot.consumer = NO_SLOT;
            slot.stream_next = NO_SLOT;
        }
        // Every field, so that a new one cannot be forgotten here.
        let Orchestrator {
            slots: _,
            head,
            next,
            tmap,
            deps,
            heap,
            ready,
            scopes: _,
            depth,
            held_from,
            stats,
            pass: _,
            found: _,
            streams,
            window,
            edge_alloc,
            edge_free,
            held: _,
            sampled,
        } = self;
        if deps.used() != 0 {
            deps.reset();
        }
        (*head, *next) = (0, 0);
        tmap.recycle();
        // The stall statistics hold the heap size a new orchestrator was
        // given (its ring keeps it rounded down to the alignment).
        let heap_bytes = stats.of(StallReason::HeapRingFull).capacity;
        *heap = HeapRing::new(heap_bytes);
        (ready.head, ready.tail) = ([0; 2], [0; 2]);
        // Scopes above the depth are never read.
        *depth = 0;
        *held_from = NONE;
        *stats = StallStats::new([TASKS as u64, TMAP as u64, DEPS as u64, heap_bytes, 0, 0, 0]);
        streams.clear();
        *window = TASKS as u64;
        (*edge_alloc, *edge_free) = (0, 0);
        *sampled = 0;
    }

    /// Limits the tasks in flight (submitted and not retired) to `tasks`,
    /// 1 ..= `TASKS` (a workload's task window): a submission beyond it
    /// stalls on `TASK_RING_FULL`, as on a ring of that size. Only between
    /// runs: [`WindowError::OutOfRange`] if `tasks` is outside that range,
    /// else [`WindowError::InFlight`] if tasks are in flight; either leaves
    /// the window as it was.
    pub fn set_window(&mut self, tasks: u64) -> Result<(), WindowError> {
        if tasks == 0 || tasks > TASKS as u64 {
            return Err(WindowError::OutOfRange {
                tasks,
                max: TASKS as u64,
            });
        }
        if !self.is_drained() {
            return Err(WindowError::InFlight {
                in_flight: self.in_flight(),
            });
        }
        self.window = tasks;
        self.stats.resources[StallReason::TaskRingFull as usize].capacity = tasks;
        Ok(())
    }

    /// Makes the statistics' `DEPLIST_POOL_FULL` capacity that of a
    /// release graph of `edges` edge nodes, for a run that submits with
    /// [`Orchestrator::submit_linked`] (the DepList pool is unused then).
    pub fn use_graph_edges(&mut self, edges: u64) {
        self.stats.resources[StallReason::DepListPoolFull as usize].capacity = edges;
    }

    /// The task window ([`Orchestrator::set_window`]).
    pub fn window(&self) -> u64 {
        self.window
    }

    /// Whether a submitter whose task stalled should try it again now:
    /// once a [`REFILL_SHARE`]th of the window is free, rather than after
    /// every retirement; always while a scope is open (its held tasks may
    /// never make that much room, and the retry is what reports a scope
    /// deadlock).
    ///
    /// Retried after every retirement, a window that stays full (the
    /// submitter ahead of the cores) takes one task a round and stalls on
    /// the next, every time: a stall's bookkeeping and a round's for each
    /// task. Waiting for a share of the window takes that many tasks a
    /// round, with one stall (`BENCHMARKS.md`, twenty-third pass: on one
    /// scheduler thread, 83 instructions a task fewer on the scheduling
    /// bench's chain, 21 on its independent tasks).
    #[inline]
    pub fn retry_now(&self) -> bool {
        let refill = self.window / REFILL_SHARE;
        self.in_flight() + refill <= self.window || self.held_from != NONE
    }

    /// Whether a submission now would stall on a full task window (and,
    /// if so, counts the stall as the submission would, or returns the
    /// scope deadlock it would report): lets a submitter skip building a
    /// task it cannot submit yet.
    #[inline(always)]
    pub fn window_full(&mut self, now: u64) -> Result<bool, SubmitError> {
        if self.in_flight() < self.window {
            return Ok(false);
        }
        self.window_stall(now)
    }

    /// [`Orchestrator::window_full`] when it is (out of line: the
    /// submitter asks before every task, and the window is most often
    /// not full).
    #[inline(never)]
    fn window_stall(&mut self, now: u64) -> Result<bool, SubmitError> {
        match self.stall_or_scope::<()>(StallReason::TaskRingFull, now) {
            Err(SubmitError::Stall(_)) => Ok(true),
            other => other.map(|()| true),
        }
    }

    /// Stalls and high-water marks per resource so far.
    pub fn stats(&self) -> StallStats {
        let mut stats = self.stats;
        for (reason, used) in self.use_now() {
            stats.used(reason, used);
        }
        stats
    }

    /// What the task ring, the TensorMap and the edges hold now. Their
    /// high-water marks are taken from it before they shrink
    /// ([`Orchestrator::sample_use`]) and when they are read, not at every
    /// submission: use grows only at submissions and shrinks only when
    /// tasks complete or retire, so its largest value since the marks
    /// were last taken is its value before the first shrink, and the
    /// marks are the same as if every submission took them. Edges of both
    /// kinds are counted (a run takes edges of one kind: the release
    /// graph's, or the DepList pool's).
    fn use_now(&self) -> [(StallReason, u64); 3] {
        [
            (StallReason::TaskRingFull, self.in_flight()),
            (StallReason::TensorMapPoolFull, self.tmap.used() as u64),
            (
                StallReason::DepListPoolFull,
                self.deps.used() as u64 + (self.edge_alloc - self.edge_free),
            ),
        ]
    }

    /// Takes the high-water marks of [`Orchestrator::use_now`] if a task
    /// was submitted since they were last taken: before anything it
    /// counts shrinks.
    #[inline(always)]
    fn sample_use(&mut self) {
        if self.sampled != self.next {
            self.take_use();
        }
    }

    /// [`Orchestrator::sample_use`]'s work, out of line: once for a run of
    /// submissions (the submitter's loop completes tasks in batches).
    #[inline(never)]
    fn take_use(&mut self) {
        self.sampled = self.next;
        for (reason, used) in self.use_now() {
            self.stats.used(reason, used);
        }
    }

    /// Tasks submitted and not yet retired.
    pub fn in_flight(&self) -> u64 {
        self.next - self.head
    }

    /// Every submitted task has completed and retired.
    pub fn is_drained(&self) -> bool {
        self.head == self.next
    }

    /// Tasks submitted over the orchestrator's life (the next task's id).
    pub fn submitted(&self) -> u64 {
        self.next
    }

    /// Tasks ready to run on `kind` cores.
    pub fn ready_count(&self, kind: CoreKind) -> u64 {
        self.ready.len(kind as usize)
    }

    /// Whether a task is ready to run on cores of either kind.
    pub fn has_ready(&self) -> bool {
        self.ready.len(0) | self.ready.len(1) != 0
    }

    fn slot(&self, id: TaskId) -> &Slot {
        &self.slots[(id % TASKS as u64) as usize]
    }

    fn slot_mut(&mut self, id: TaskId) -> &mut Slot {
        &mut self.slots[(id % TASKS as u64) as usize]
    }

    /// Whether `id` was submitted and has not completed.
    pub fn is_live(&self, id: TaskId) -> bool {
        id >= self.head && id < self.next && self.slot(id).state != TaskState::Completed
    }

    /// A task, submitted and not completed, that writes a region of `tensor`
    /// overlapping `region`: while there is one, reading the region would
    /// race with it (or read stale data). Later tasks are not submitted yet,
    /// so once this returns `None` the region holds its final value for
    /// everything submitted so far.
    pub fn pending_writer(&mut self, tensor: u32, region: &Region) -> Option<TaskId> {
        struct Writers<'s, const T: usize> {
            slots: &'s [Slot; T],
            next: TaskId,
            found: Option<TaskId>,
        }
        impl<const T: usize> Visitor for Writers<'_, T> {
            fn live(&self, task: TaskId) -> bool {
                live(self.slots, self.next, task)
            }
            fn conflict(&mut self, task: TaskId) {
                self.found = Some(self.found.map_or(task, |f| f.min(task)));
            }
        }
        let mut v = Writers {
            slots: &self.slots,
            next: self.next,
            found: None,
        };
        let place = self.tmap.place(tensor, region);
        // A read conflicts with writer entries only, and records nothing.
        self.tmap.scan(&place, tensor, region, false, false, &mut v);
        v.found
    }

    /// Whether every task from `first` on that was submitted has completed.
    pub fn completed_since(&self, first: TaskId) -> bool {
        self.completed_since_where(first, |_| true)
    }

    /// Whether every task from `first` on that was submitted and that
    /// `mine` picks has completed (e.g. the tasks of one process).
    pub fn completed_since_where(&self, first: TaskId, mine: impl Fn(TaskId) -> bool) -> bool {
        (first.max(self.head)..self.next)
            .all(|id| self.slot(id).state == TaskState::Completed || !mine(id))
    }

    /// Submits a task at time `now` (the caller's clock, for stall times),
    /// on no stream. Nothing changes unless it returns `Ok`.
    pub fn submit(
        &mut self,
        now: u64,
        kernel: KernelRef,
        args: &[TaskArg],
        heap_bytes: u64,
        extra_deps: &[TaskId],
        tag: u64,
    ) -> Result<TaskId, SubmitError> {
        self.submit_in::<0>(now, 0, kernel, args, heap_bytes, extra_deps, tag, None)
            .map(|(id, _)| id)
    }

    /// Submits a task on `stream` (1 ..= [`MAX_STREAMS`](crate::abi::MAX_STREAMS),
    /// or 0 for none): besides its inferred and explicit dependencies, it
    /// becomes ready only after the stream's previous task was issued (see
    /// [`Orchestrator::issued`]), and after every event its stream waits for.
    #[allow(clippy::too_many_arguments)]
    pub fn submit_on(
        &mut self,
        now: u64,
        stream: StreamId,
        kernel: KernelRef,
        args: &[TaskArg],
        heap_bytes: u64,
        extra_deps: &[TaskId],
        tag: u64,
    ) -> Result<TaskId, SubmitError> {
        self.submit_in::<0>(now, stream, kernel, args, heap_bytes, extra_deps, tag, None)
            .map(|(id, _)| id)
    }

    /// Submits a task for a run whose scheduler threads release dependents
    /// themselves: like [`Orchestrator::submit_on`] (no heap block, no
    /// explicit dependencies), but the edges from its unfinished producers
    /// (and its stream's previous task, until issued) go into `graph`,
    /// where the threads that observe their completions release it
    /// ([`ReleaseGraph::complete`], [`ReleaseGraph::issued`]) and hand
    /// `release_tag` on to be queued. Returns the task's id and whether it
    /// is ready at once: then the caller queues it, or hands it to
    /// [`Orchestrator::released`] to take it from the ready list of its
    /// kind ([`Orchestrator::pop_ready`]). Report each finished
    /// task with [`Orchestrator::finished`], not `complete`; use one
    /// protocol for the orchestrator's whole life between drains.
    #[allow(clippy::too_many_arguments)]
    pub fn submit_linked<const E: usize>(
        &mut self,
        graph: &ReleaseGraph<TASKS, E>,
        now: u64,
        stream: StreamId,
        kernel: KernelRef,
        args: &[TaskArg],
        tag: u64,
        release_tag: u64,
    ) -> Result<(TaskId, bool), SubmitError> {
        let linked = Some((graph, release_tag));
        self.submit_in(now, stream, kernel, args, 0, &[], tag, linked)
            .map(|(id, ready)| (id, ready.unwrap_or(false)))
    }

    /// Edges of the release graph (of `E` nodes) free for new links.
    fn edges_available<const E: usize>(&self) -> u64 {
        E as u64 - (self.edge_alloc - self.edge_free)
    }

    /// The body of [`Orchestrator::submit`], [`Orchestrator::submit_on`]
    /// and [`Orchestrator::submit_linked`], inlined into each: `submit`
    /// then pays nothing for streams (its constant stream 0 folds the
    /// stream code away) and no extra call, and the owner-completes forms
    /// nothing for the release graph (`linked` is a constant `None`).
    /// With `linked`, returns whether the task is ready now.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn submit_in<const E: usize>(
        &mut self,
        now: u64,
        stream: StreamId,
        kernel: KernelRef,
        args: &[TaskArg],
        heap_bytes: u64,
        extra_deps: &[TaskId],
        tag: u64,
        linked: Option<(&ReleaseGraph<TASKS, E>, u64)>,
    ) -> Result<(TaskId, Option<bool>), SubmitError> {
        if stream != 0 && !is_stream(stream) {
            return Err(SubmitError::Invalid(Invalid::NoSuchStream { stream }));
        }
        if args.len() > MAX_TENSOR_ARGS {
            return Err(SubmitError::Invalid(Invalid::TooManyArgs {
                count: args.len(),
                max: MAX_TENSOR_ARGS,
            }));
        }
        if let Some(&id) = extra_deps.iter().find(|&&id| id >= self.next) {
            return Err(SubmitError::Invalid(Invalid::UnknownTask {
                id,
                next: self.next,
            }));
        }
        if let Some((index, other)) = overlapping_args(args) {
            return Err(SubmitError::Invalid(Invalid::ArgsOverlap { index, other }));
        }
        let heap_capacity = self.heap.capacity();
        if heap_bytes > heap_capacity {
            let cause = DeadlockCause::HeapRequestTooLarge {
                requested: heap_bytes,
                capacity: heap_capacity,
            };
            return Err(SubmitError::Deadlock(cause));
        }
        if args.len() > TMAP {
            let pool = StallReason::TensorMapPoolFull;
            let cause = DeadlockCause::TaskExceedsPool {
                pool,
                needed: args.len() as u64,
                capacity: TMAP as u64,
            };
            return Err(SubmitError::Deadlock(cause));
        }

        // Room in every resource, checked before anything changes.
        if self.in_flight() >= self.window {
            return self.stall_or_scope(StallReason::TaskRingFull, now);
        }
        if self.tmap.available() < args.len() {
            return self.stall_or_scope(StallReason::TensorMapPoolFull, now);
        }
        let id = self.next;
        // Each producer is a distinct live task, so a pool with room for one
        // edge per task in flight cannot run out: wire in one pass while
        // committing, placing and inserting each argument as its scan ends.
        // Otherwise place the arguments and count the edges first, so that
        // a stall changes nothing.
        let available = match linked {
            None => self.deps.available() as u64,
            Some(_) => self.edges_available::<E>(),
        };
        let one_pass = available >= self.in_flight();
        if one_pass && stream == 0 && heap_bytes == 0 && extra_deps.is_empty() {
            // Nothing can stall from here on: the common case's commit.
            return Ok(self.commit_tiles(now, id, kernel, args, tag, linked));
        }
        let submission = Submission {
            now,
            stream,
            kernel,
            args,
            heap_bytes,
            extra_deps,
            tag,
        };
        self.submit_rest(submission, linked, one_pass, available)
    }

    /// The rest of [`Orchestrator::submit_in`] for a submission that
    /// [`Orchestrator::commit_tiles`] does not take (on a stream, with a
    /// heap block or explicit dependencies, or whose edges might not fit);
    /// out of line, so that the common case keeps its state in registers.
    #[inline(never)]
    fn submit_rest<const E: usize>(
        &mut self,
        submission: Submission,
        linked: Option<(&ReleaseGraph<TASKS, E>, u64)>,
        one_pass: bool,
        available: u64,
    ) -> Result<(TaskId, Option<bool>), SubmitError> {
        let Submission {
            now,
            stream,
            kernel,
            args,
            heap_bytes,
            extra_deps,
            tag,
        } = submission;
        let id = self.next;
        let mut places = [Place::default(); MAX_TENSOR_ARGS];
        let places = &mut places[..args.len()];
        let mut edges = 0;
        if !one_pass {
            place_args(&mut self.tmap, args, places);
            // More edges than the whole pool is no deadlock: the count is of
            // producers still running, and each one that completes frees its
            // edges and drops out of the count.
            edges = self.count_edges::<E>(id, stream, args, places, extra_deps);
            if available < edges {
                return self.stall(StallReason::DepListPoolFull, now);
            }
        }
        let heap = if heap_bytes == 0 {
            HeapBlock::default()
        } else {
            match self.heap.alloc(heap_bytes) {
                Ok(block) => block,
                Err(_) => return self.stall_or_scope(StallReason::HeapRingFull, now),
            }
        };

        // Commit: the slot, the edges from live producers, the TensorMap entries.
        self.stats.end(now);
        // The slot's other fields are as its last task left them and need
        // no reset: `fanout` and `stream_next` are emptied when a task
        // completes (and stay empty when the release graph holds the
        // edges), `tmap_end` and
        // `edges_end` below, and `marked_by` only ever matches a pass of its own.
        // Checked above: 0 or a stream number, at most `MAX_STREAMS`.
        let slot = self.open_slot(id, kernel, tag, heap, stream as u8);
        slot.fanin = 1;
        let at = (id % TASKS as u64) as usize;
        let graph = linked.map(|(graph, _)| graph);
        if let Some((graph, release_tag)) = linked {
            graph.open(at, release_tag);
        }
        let mut linked_edges = 0u32;
        if !one_pass && edges as usize <= self.found.len() && self.tmap.cover_pending() {
            // The counting pass saw every producer and covered entry: wire
            // from its lists.
            linked_edges = self.wire_found(id, edges, graph);
            insert_args(&mut self.tmap, args, places, id);
        } else {
            // Places the arguments (unless the counting pass did) and
            // inserts them.
            let placed = (!one_pass).then_some(&*places);
            let resume = Resume {
                from: 0,
                first: None,
                mark: 0,
                count: 0,
            };
            edges = self.wire_rest(id, stream, args, placed, extra_deps, graph, resume);
            if graph.is_some() {
                linked_edges = edges as u32;
            }
        }
        if stream != 0 {
            // Held back until the stream's previous task is issued. A task
            // at or past `head` has not retired; one that completed was issued.
            let before = self.streams.last(stream);
            if before != NONE && before >= self.head {
                match linked {
                    None => {
                        let waiting =
                            |s: TaskState| s != TaskState::Issued && s != TaskState::Completed;
                        if waiting(self.slot(before).state) {
                            self.slot_mut(before).stream_next = at as u16;
                            self.slot_mut(id).fanin += 1;
                        }
                    }
                    Some((graph, _)) => {
                        let b = (before % TASKS as u64) as usize;
                        if self.slot(before).state != TaskState::Completed
                            && graph.link_stream(b, at)
                        {
                            linked_edges += 1;
                        }
                    }
                }
            }
            self.streams.submitted(stream, id);
        }
        self.next += 1;
        let tmap_end = self.tmap.end();
        let edge_alloc = self.edge_alloc;
        let slot = self.slot_mut(id);
        slot.tmap_end = tmap_end as u32;
        slot.edges_end = edge_alloc as u32;
        let ready = match linked {
            None => {
                self.release(id);
                None
            }
            Some((graph, _)) => Some(graph.arm(at, linked_edges)),
        };
        if heap_bytes > 0 {
            self.stats.used(StallReason::HeapRingFull, self.heap.used());
        }
        Ok((id, ready))
    }

    /// The commit of a submission on no stream, with no heap block and no
    /// explicit dependencies, whose edges fit (`one_pass` in
    /// [`Orchestrator::submit_in`]): the common case, for which nothing
    /// can stall any more. Each argument placed [`Place::simple`] (a tile
    /// whose lookup scans its home bucket only, which reports no implied
    /// conflict to leave out and needs no held conflicts) is scanned and
    /// inserted by one lean pass ([`Tiles`]) as soon as it is placed; from
    /// the first argument that is not, the general pass
    /// ([`Orchestrator::wire_rest`]) takes the rest, in the same pass (the
    /// same mark, counting on). The same edges, entries and figures as
    /// [`Orchestrator::wire`]'s committing pass; kept apart so that the
    /// common case's state stays in registers.
    #[inline(always)]
    fn commit_tiles<const E: usize>(
        &mut self,
        now: u64,
        id: TaskId,
        kernel: KernelRef,
        args: &[TaskArg],
        tag: u64,
        linked: Option<(&ReleaseGraph<TASKS, E>, u64)>,
    ) -> (TaskId, Option<bool>) {
        self.stats.end(now);
        let at = (id % TASKS as u64) as usize;
        // As in `submit_rest`: the other fields need no reset.
        self.open_slot(id, kernel, tag, HeapBlock::default(), 0);
        let graph = linked.map(|(graph, _)| graph);
        if let Some((graph, release_tag)) = linked {
            graph.open(at, release_tag);
        }
        // Without the graph, a producer met twice is told by its fan-out
        // list, which starts with this task's edge then: no mark is needed
        // unless the general pass takes over.
        let mark = if linked.is_some() {
            self.next_mark()
        } else {
            0
        };
        // Committing scans unlink what they cover at once and remember
        // nothing for `cover_pending`: no `tmap.begin()` here.
        let mut count = 0;
        let mut left = args;
        while let [a, after @ ..] = left {
            // The commonest argument first, by a place whose flags are
            // constants in the scan and insert inlined for it: a second
            // copy of them, specialized, about 20 instructions an
            // argument fewer (BENCHMARKS.md, twenty-second pass).
            let (place, exact) = match self.tmap.place_exact(a.tensor, &a.region) {
                Some(place) => (place, true),
                None => (self.tmap.place(a.tensor, &a.region), false),
            };
            if !exact && !place.simple() {
                let resume = Resume {
                    from: args.len() - left.len(),
                    first: Some(place),
                    mark,
                    count,
                };
                count = if graph.is_some() && place.tile_beside_wide() {
                    // The release graph's runs only, inline as the general
                    // pass below: without the graph (a constant in
                    // `submit`) this folds away, and the owner-completes
                    // path stays as it was (a third pass in its loop cost
                    // the orchestration bench 2 to 21 instructions a task
                    // in registers, inline or not).
                    self.commit_beside_wide_from(id, args, graph, resume)
                } else if graph.is_some() {
                    // The release graph's runs (the runtime's own): inline,
                    // as their tile tasks among wide ones (a round's
                    // fan-in) come here for most submissions, where a call
                    // cost about 100 instructions a task (BENCHMARKS.md).
                    self.wire_from::<E, false>(id, 0, args, None, &[], Some(graph), resume)
                } else {
                    self.wire_rest(id, 0, args, None, &[], graph, resume)
                };
                break;
            }
            count = if exact {
                self.commit_simple::<E, true>(&place, a, id, mark, graph, count)
            } else {
                self.commit_simple::<E, false>(&place, a, id, mark, graph, count)
            };
            left = after;
        }
        self.next += 1;
        let tmap_end = self.tmap.end();
        let edge_alloc = self.edge_alloc;
        let slot = &mut self.slots[at];
        slot.tmap_end = tmap_end as u32;
        slot.edges_end = edge_alloc as u32;
        let ready = match linked {
            None => {
                slot.fanin = count as u32;
                if count == 0 {
                    self.push_ready(id);
                }
                None
            }
            Some((graph, _)) => Some(graph.arm(at, count as u32)),
        };
        (id, ready)
    }

    /// [`Orchestrator::commit_tiles`]'s scan and insert of an argument
    /// placed [`Place::simple`], in the pass of `mark` whose `count`
    /// producers so far it goes on counting; returns the new count.
    /// `EXACT`: the place is [`TensorMap::place_exact`]'s, whose flags
    /// this copy takes as constants (it folds their tests), and it is
    /// inlined twice more, for a read and for a write.
    #[inline(always)]
    fn commit_simple<const E: usize, const EXACT: bool>(
        &mut self,
        place: &Place,
        a: &TaskArg,
        id: TaskId,
        mark: u32,
        graph: Option<&ReleaseGraph<TASKS, E>>,
        count: u64,
    ) -> u64 {
        let place = &if EXACT { place.exact_simple() } else { *place };
        let writes = a.access.contains(Access::WRITE);
        let mut tiles = Tiles::<TASKS, DEPS, E> {
            slots: &mut self.slots,
            deps: &mut self.deps,
            next: self.next,
            id,
            mark,
            graph,
            edge_alloc: &mut self.edge_alloc,
            count,
        };
        let (tensor, region, tmap) = (a.tensor, &a.region, &mut self.tmap);
        match (EXACT, writes) {
            // The exact copy in two, each with `writes` a constant (22
            // instructions a task fewer on the orchestration bench's
            // three-argument tasks).
            (true, true) => tmap.scan_push_simple(place, tensor, region, true, id, &mut tiles),
            (true, false) => tmap.scan_push_simple(place, tensor, region, false, id, &mut tiles),
            (false, _) => tmap.scan_push_simple(place, tensor, region, writes, id, &mut tiles),
        }
        tiles.count
    }

    /// The rest of [`Orchestrator::commit_tiles`] from `resume.from`,
    /// whose place is [`Place::tile_beside_wide`]: a tile of one cell
    /// while some wide entry of its tensor is live (the tiles of a round
    /// after a whole-tensor task). Such arguments and simple ones commit
    /// with lean passes ([`BesideWide`], [`Tiles`]) instead of the general
    /// one's (40 instructions a task fewer on the scheduling bench's
    /// fan-out/fan-in on one thread, `BENCHMARKS.md`, twenty-third pass);
    /// the first of any other kind hands the rest to the general pass.
    #[inline(always)]
    fn commit_beside_wide_from<const E: usize>(
        &mut self,
        id: TaskId,
        args: &[TaskArg],
        graph: Option<&ReleaseGraph<TASKS, E>>,
        resume: Resume,
    ) -> u64 {
        let Resume {
            from,
            mut first,
            mark,
            mut count,
        } = resume;
        for (i, a) in args.iter().enumerate().skip(from) {
            let place = match first.take() {
                Some(place) => place,
                None => self.tmap.place(a.tensor, &a.region),
            };
            count = if place.simple() {
                self.commit_simple::<E, false>(&place, a, id, mark, graph, count)
            } else if place.tile_beside_wide() {
                self.commit_beside_wide(&place, a, id, mark, graph, count)
            } else {
                let first = Some(place);
                let resume = Resume {
                    from: i,
                    first,
                    mark,
                    count,
                };
                return self.wire_rest(id, 0, args, None, &[], graph, resume);
            };
        }
        count
    }

    /// The scan and insert of an argument placed
    /// [`Place::tile_beside_wide`], with the [`BesideWide`] pass in the
    /// pass of `mark` whose `count` producers so far it goes on counting;
    /// returns the new count.
    #[inline(always)]
    fn commit_beside_wide<const E: usize>(
        &mut self,
        place: &Place,
        a: &TaskArg,
        id: TaskId,
        mark: u32,
        graph: Option<&ReleaseGraph<TASKS, E>>,
        count: u64,
    ) -> u64 {
        let writes = a.access.contains(Access::WRITE);
        let mut pass = BesideWide {
            tiles: Tiles::<TASKS, DEPS, E> {
                slots: &mut self.slots,
                deps: &mut self.deps,
                next: self.next,
                id,
                mark,
                graph,
                edge_alloc: &mut self.edge_alloc,
                count,
            },
            held: None,
            reader: 0,
            cutoff: 0,
        };
        self.tmap
            .scan_push(place, a.tensor, &a.region, writes, id, &mut pass);
        pass.end_argument()
    }

    /// Writes a new task's slot (`state` pending; the other fields are as
    /// its last task left them and need no reset, see `submit_rest`).
    #[inline(always)]
    fn open_slot(
        &mut self,
        id: TaskId,
        kernel: KernelRef,
        tag: u64,
        heap: HeapBlock,
        stream: u8,
    ) -> &mut Slot {
        let slot = self.slot_mut(id);
        slot.id = id;
        slot.kernel_id = kernel.id;
        slot.vector = kernel.kind == CoreKind::Vector;
        slot.tag = tag;
        slot.state = TaskState::Pending;
        slot.heap = heap;
        slot.stream = stream;
        slot
    }

    /// The general committing pass ([`Orchestrator::wire_from`]), of a
    /// whole submission ([`Orchestrator::submit_rest`]: `resume` from the
    /// first argument, with no mark yet) or of the arguments
    /// [`Orchestrator::commit_tiles`] leaves (from its first argument not
    /// placed [`Place::simple`] on, in its pass). Returns the producers
    /// counted, those of `resume.count` included. Out of line, one copy
    /// for both: rare, and inlined it would be a second copy of the pass
    /// in every submission.
    #[allow(clippy::too_many_arguments)]
    #[inline(never)]
    fn wire_rest<const E: usize>(
        &mut self,
        id: TaskId,
        stream: StreamId,
        args: &[TaskArg],
        places: Option<&[Place]>,
        extra_deps: &[TaskId],
        graph: Option<&ReleaseGraph<TASKS, E>>,
        resume: Resume,
    ) -> u64 {
        let mut resume = resume;
        if resume.mark == 0 {
            // Marks are never 0 ([`Orchestrator::next_mark`]).
            resume.mark = self.next_mark();
        }
        // Committing: nothing remembered for `cover_pending` (as in
        // `commit_tiles`).
        let commit = Some(graph);
        self.wire_from::<E, false>(id, stream, args, places, extra_deps, commit, resume)
    }

    /// The counting pass of a submission whose edges might not fit the
    /// DepList pool ([`Orchestrator::wire`] without committing). Out of
    /// line: rare, and inlined it would be a second copy of the pass in
    /// every submission.
    #[inline(never)]
    fn count_edges<const E: usize>(
        &mut self,
        id: TaskId,
        stream: StreamId,
        args: &[TaskArg],
        places: &[Place],
        extra_deps: &[TaskId],
    ) -> u64 {
        self.wire::<E, true>(id, stream, args, Some(places), extra_deps, None)
    }

    /// Records an edge to task `id` from each of the `edges` producers the
    /// counting pass found (all of them: `edges` fits the `found` list):
    /// in the DepList pool, or in `graph` if given. Returns the edges the
    /// graph took (producers that completed meanwhile get none).
    #[inline(never)]
    fn wire_found<const E: usize>(
        &mut self,
        id: TaskId,
        edges: u64,
        graph: Option<&ReleaseGraph<TASKS, E>>,
    ) -> u32 {
        let at = (id % TASKS as u64) as usize;
        let mut linked = 0;
        for &p in &self.found[..edges as usize] {
            let producer = (p % TASKS as u64) as usize;
            match graph {
                None => link(&mut self.slots[producer], &mut self.deps, id, at),
                Some(graph) => {
                    let edge = (self.edge_alloc % E as u64) as usize;
                    if graph.link(producer, at, edge) {
                        self.edge_alloc += 1;
                        linked += 1;
                    }
                }
            }
        }
        if graph.is_none() {
            self.slot_mut(id).fanin += edges as u32;
        }
        linked
    }

    /// A full task ring, TensorMap or heap ring frees space only when the
    /// oldest task retires; if an open scope holds it, nothing can retire
    /// before the scope ends, which cannot happen while submission waits.
    fn stall_or_scope<T>(&mut self, reason: StallReason, now: u64) -> Result<T, SubmitError> {
        if self.head < self.next && self.held(self.head) {
            self.stats.stalled(reason, now);
            return Err(SubmitError::Deadlock(self.scope_deadlock(reason)));
        }
        self.stall(reason, now)
    }

    fn stall<T>(&mut self, reason: StallReason, now: u64) -> Result<T, SubmitError> {
        self.stats.stalled(reason, now);
        Err(SubmitError::Stall(reason))
    }

    /// The mark of a new dependency pass: the pass count's low 32 bits,
    /// never 0. When they wrap to 0 (every 2^32 passes) every slot's mark
    /// is cleared to 0, so that no slot keeps a mark an old pass left that
    /// a new pass would take for its own.
    #[inline(always)]
    fn next_mark(&mut self) -> u32 {
        self.pass += 1;
        if self.pass as u32 == 0 {
            self.clear_marks();
        }
        self.pass as u32
    }

    #[inline(never)]
    fn clear_marks(&mut self) {
        for slot in &mut self.slots {
            slot.marked_by = 0;
        }
        self.pass += 1;
    }

    /// Finds the distinct live producers of task `id` (submitted or about to
    /// be) and, when `commit` is given, records an edge from each: in the
    /// DepList pool and the task's fan-in when it is `Some(None)`, in the
    /// release graph when `Some(Some(graph))`. Returns their number (with
    /// a graph, the number linked: producers that completed meanwhile get
    /// no edge). A fresh mark per pass dedups producers met through several
    /// arguments (a stalled submission is retried with the same id, so the
    /// mark cannot derive from the id). `COUNTING` when `commit` is `None`.
    ///
    /// The arguments' places are `places`, or, when `None`, placed here.
    /// A committing pass inserts each argument's entry as soon as its scan
    /// ends, in the same loop (one walk over the arguments instead of
    /// three). The later arguments' scans may then meet the task's own
    /// entries: harmless, as no two arguments of a task conflict
    /// ([`overlapping_args`]), so such an entry is never reported, and
    /// marked covered only by a write of the same region, which overlaps.
    #[inline(always)]
    fn wire<const E: usize, const COUNTING: bool>(
        &mut self,
        id: TaskId,
        stream: StreamId,
        args: &[TaskArg],
        places: Option<&[Place]>,
        extra_deps: &[TaskId],
        commit: Option<Option<&ReleaseGraph<TASKS, E>>>,
    ) -> u64 {
        let mark = self.next_mark();
        self.tmap.begin();
        let resume = Resume {
            from: 0,
            first: None,
            mark,
            count: 0,
        };
        self.wire_from::<E, COUNTING>(id, stream, args, places, extra_deps, commit, resume)
    }

    /// [`Orchestrator::wire`] of the arguments from `resume.from` on (the
    /// ones before were wired by the same pass: [`Orchestrator::commit_tiles`]),
    /// in the pass of `resume.mark`, whose `resume.count` producers so far
    /// it goes on counting; `resume.first`, if given, is the place of the
    /// argument `resume.from` (placed already).
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn wire_from<const E: usize, const COUNTING: bool>(
        &mut self,
        id: TaskId,
        stream: StreamId,
        args: &[TaskArg],
        places: Option<&[Place]>,
        extra_deps: &[TaskId],
        commit: Option<Option<&ReleaseGraph<TASKS, E>>>,
        resume: Resume,
    ) -> u64 {
        debug_assert_eq!(
            COUNTING,
            commit.is_none(),
            "only a counting pass commits nothing"
        );
        let Resume {
            from,
            first,
            mark,
            count,
        } = resume;
        let mut wiring = Wiring::<TASKS, DEPS, E, COUNTING> {
            slots: &mut self.slots,
            deps: &mut self.deps,
            found: &mut self.found,
            head: self.head,
            next: self.next,
            id,
            mark,
            commit: commit.is_some(),
            graph: commit.flatten(),
            edge_alloc: &mut self.edge_alloc,
            count,
            held: &mut self.held,
            held_len: 0,
            hold: false,
            cutoff: 0,
            reader: 0,
        };
        for i in from..MAX_TENSOR_ARGS {
            let Some(a) = args.get(i) else { break };
            let place = match (places, first) {
                (Some(places), _) => places[i],
                (None, Some(first)) if i == from => first,
                (None, _) => self.tmap.place(a.tensor, &a.region),
            };
            let writes = a.access.contains(Access::WRITE);
            // Held conflicts pay only where a cut can leave some out.
            wiring.hold = !place.simple();
            self.tmap.scan(
                &place,
                a.tensor,
                &a.region,
                writes,
                commit.is_some(),
                &mut wiring,
            );
            wiring.end_argument();
            if commit.is_some() {
                self.tmap.push(&place, a.tensor, a.region, writes, id);
            }
        }
        for &p in extra_deps {
            if wiring.live(p) {
                wiring.edge(p);
            }
        }
        if stream != 0 {
            for (source, bound) in self.streams.waits(stream) {
                wiring.stream_tasks(source, bound);
            }
        }
        let count = wiring.count;
        if matches!(commit, Some(None)) {
            self.slot_mut(id).fanin += count as u32;
        }
        count
    }

    /// Drops one from the fan-in of `id`; at zero the task becomes ready.
    fn release(&mut self, id: TaskId) {
        self.release_at((id % TASKS as u64) as usize);
    }

    /// [`Orchestrator::release`] of the task in slot `at` (live).
    #[inline(always)]
    fn release_at(&mut self, at: usize) {
        let slot = &mut self.slots[at % TASKS];
        slot.fanin -= 1;
        if slot.fanin > 0 {
            return;
        }
        self.ready_at(at);
    }

    /// Task `id`, submitted with [`Orchestrator::submit_linked`], was
    /// released in the graph by a thread that leaves it to the caller to
    /// place: into the ready list of its kind, for
    /// [`Orchestrator::pop_ready`]. Refused for a task not waiting.
    pub fn released(&mut self, id: TaskId) -> Result<(), UsageError> {
        if id < self.head || id >= self.next || self.slot(id).state != TaskState::Pending {
            return Err(UsageError::NotRunning { id });
        }
        self.push_ready(id);
        Ok(())
    }

    /// Appends `id` (live, not ready yet) to the ready list of its kind;
    /// for the dispatcher, a task [`Orchestrator::submit_linked`] found
    /// ready at once.
    pub(crate) fn push_ready(&mut self, id: TaskId) {
        self.ready_at((id % TASKS as u64) as usize);
    }

    /// [`Orchestrator::push_ready`] of the task in slot `at`.
    #[inline(always)]
    fn ready_at(&mut self, at: usize) {
        let slot = &mut self.slots[at % TASKS];
        slot.state = TaskState::Ready;
        let kind = slot.kernel().kind as usize;
        self.ready.push(kind, at % TASKS);
    }

    /// The oldest ready task for `kind` cores, now running.
    pub fn pop_ready(&mut self, kind: CoreKind) -> Option<ReadyTask> {
        let at = self.ready.pop(kind as usize)?;
        // A ready task is live: its slot holds its id.
        let slot = &mut self.slots[at % TASKS];
        let id = slot.id;
        slot.state = TaskState::Running;
        Some(ReadyTask {
            id,
            kernel: slot.kernel(),
            tag: slot.tag,
            heap: slot.heap,
        })
    }

    /// Task `id`, handed out by [`Orchestrator::pop_ready`], was issued to
    /// a core: the next task of its stream may become ready. A caller that
    /// never calls this serializes streams: [`Orchestrator::complete`]
    /// counts as the issue too. Calling it twice is harmless.
    pub fn issued(&mut self, id: TaskId) -> Result<(), UsageError> {
        if !self.is_running(id) {
            return Err(UsageError::NotRunning { id });
        }
        self.slot_mut(id).state = TaskState::Issued;
        self.release_stream_next(id);
        Ok(())
    }

    /// Whether an open scope keeps task `id` (submitted, so below `next`:
    /// the test alone would call any later id held too) from retiring.
    fn held(&self, id: TaskId) -> bool {
        id >= self.held_from
    }

    /// Handed out and not completed (issued or not). As in [`live`], the
    /// slot tells: it holds `id` only if `id` was submitted, and not if it
    /// retired unless it completed.
    fn is_running(&self, id: TaskId) -> bool {
        let slot = self.slot(id);
        slot.id == id && matches!(slot.state, TaskState::Running | TaskState::Issued)
    }

    /// Lets the task held back behind `id` on its stream go.
    #[inline(always)]
    fn release_stream_next(&mut self, id: TaskId) {
        // Most tasks have none: then nothing is written.
        let next = self.slot(id).stream_next;
        if next != NO_SLOT {
            self.slot_mut(id).stream_next = NO_SLOT;
            // Held back, so live: its slot is its own.
            self.release_at(next as usize);
        }
    }

    /// Records `event` on `stream` at this point of the program: it stands
    /// for the stream's tasks submitted so far, and has happened when all
    /// of them have completed. Recording it again replaces that set.
    pub fn record_event(&mut self, stream: StreamId, event: EventId) -> Result<(), UsageError> {
        Self::check_stream_event(stream, event)?;
        self.streams.record(stream, event, self.next);
        Ok(())
    }

    /// Makes the next task submitted on `stream` (and, since a stream
    /// issues in order, every later one) wait until `event`, as last
    /// recorded, has happened.
    pub fn wait_event(&mut self, stream: StreamId, event: EventId) -> Result<(), UsageError> {
        Self::check_stream_event(stream, event)?;
        if !self.streams.wait(stream, event) {
            return Err(UsageError::EventNotRecorded { event });
        }
        Ok(())
    }

    fn check_stream_event(stream: StreamId, event: EventId) -> Result<(), UsageError> {
        if !is_stream(stream) {
            return Err(UsageError::NoSuchStream { stream });
        }
        if event as usize >= crate::abi::MAX_EVENTS {
            return Err(UsageError::NoSuchEvent { event });
        }
        Ok(())
    }

    /// Forgets streams' last tasks, pending waits and events: for a new
    /// program (a table run) on a drained orchestrator.
    pub fn clear_streams(&mut self) {
        self.streams.clear();
    }

    /// Task `id` finished: releases its consumers and retires what it can.
    #[inline]
    pub fn complete(&mut self, id: TaskId) -> Result<(), UsageError> {
        self.complete_unretired(id)?;
        // Tasks retire from the oldest on, and one that completes while
        // an older one is live cannot be the first to retire (the oldest
        // retired when it completed, unless a scope holds it; the scope's
        // end retires then).
        if id == self.head {
            self.retire();
        }
        Ok(())
    }

    /// [`Orchestrator::complete`] but for the retirement, which waits for
    /// [`Orchestrator::retire_completed`]: for a caller that takes
    /// completions in batches, one retirement walk a batch. Until then the
    /// tasks count as in flight.
    #[inline]
    pub fn complete_unretired(&mut self, id: TaskId) -> Result<(), UsageError> {
        if !self.is_running(id) {
            return Err(UsageError::NotRunning { id });
        }
        self.release_stream_next(id);
        self.slot_mut(id).state = TaskState::Completed;
        // A task's first edge is in its slot, the rest in the pool (see
        // `link`): with none in the slot, there are none.
        let first = self.slot(id).consumer;
        if first != NO_SLOT {
            // Newest edge first, as they were linked: the pool's, then the
            // slot's.
            let mut fanout = self.slot(id).fanout;
            if fanout != NIL {
                // Before the pool's nodes are given back.
                self.sample_use();
                while let Some(consumer) = self.deps.pop(&mut fanout) {
                    self.release(consumer);
                }
                self.slot_mut(id).fanout = NIL;
            }
            self.slot_mut(id).consumer = NO_SLOT;
            // A consumer waits, so is live: its slot is its own.
            self.release_at(first as usize);
        }
        Ok(())
    }

    /// Retires the tasks [`Orchestrator::complete_unretired`] completed
    /// (from the oldest on, up to one still live or held by a scope).
    pub fn retire_completed(&mut self) {
        self.retire();
    }

    /// Task `id`, submitted with [`Orchestrator::submit_linked`], finished
    /// and its completer released its consumers in the graph: marks it
    /// completed and retires what it can. Refused for a task not submitted,
    /// retired or reported before, and for one submitted without the graph
    /// that has consumers or a stream successor of its own to release
    /// (they would wait for ever).
    pub fn finished(&mut self, id: TaskId) -> Result<(), UsageError> {
        self.finished_unretired(id)?;
        // As in `complete`: only the oldest task's completion retires.
        if id == self.head {
            self.retire();
        }
        Ok(())
    }

    /// [`Orchestrator::finished`] but for the retirement, which waits for
    /// [`Orchestrator::retire_completed`] (one walk for a batch of
    /// reports, as [`Orchestrator::complete_unretired`]).
    pub fn finished_unretired(&mut self, id: TaskId) -> Result<(), UsageError> {
        if id < self.head || id >= self.next || self.slot(id).state == TaskState::Completed {
            return Err(UsageError::NotRunning { id });
        }
        // A linked task's edges are in the graph: its own lists stay empty.
        let slot = self.slot(id);
        if slot.fanout != NIL || slot.consumer != NO_SLOT || slot.stream_next != NO_SLOT {
            return Err(UsageError::OwnerCompletes { id });
        }
        self.slot_mut(id).state = TaskState::Completed;
        Ok(())
    }

    /// Retires completed tasks from the oldest on, until one is still live
    /// or held by a scope; reclaims their slots, heap and TensorMap entries.
    #[inline(always)]
    fn retire(&mut self) {
        self.sample_use();
        // Up to the first task a scope holds, if one is open.
        let (first, end) = (self.head, self.next.min(self.held_from));
        let mut head = first;
        // In runs of slots that do not wrap round the ring: a pointer
        // walk, with no index to reduce a task.
        while head < end {
            let at = (head % TASKS as u64) as usize;
            let run = ((end - head) as usize).min(TASKS - at);
            let slots = &self.slots[at..at + run];
            match slots.iter().position(|s| s.state != TaskState::Completed) {
                Some(done) => {
                    head += done as u64;
                    break;
                }
                None => head += run as u64,
            }
        }
        if head == first {
            return;
        }
        // Most runs take no heap block: one test for the batch then.
        if !self.heap.is_empty() {
            for id in first..head {
                let heap = self.slot(id).heap;
                self.heap.free(heap);
            }
        }
        // The newest task retired ends the TensorMap entries and the
        // release-graph edges reclaimed (tasks take both in order).
        let slot = self.slot(head - 1);
        // Its positions are at most a ring's capacity behind the ring's
        // current one (older tasks' entries are reclaimed).
        let tmap_end = restore(self.tmap.end(), slot.tmap_end);
        // Its release-graph edges: its producers' lists were walked
        // before it could run, so no thread reads them any more. (None
        // are taken without the graph: nothing to work out then.)
        if self.edge_free != self.edge_alloc {
            let edges_end = restore(self.edge_alloc, slot.edges_end);
            self.edge_free = self.edge_free.max(edges_end);
        }
        self.tmap.release_until(tmap_end);
        self.head = head;
    }

    /// Opens a scope: the outputs of tasks submitted until its end stay alive
    /// (their tasks do not retire) until [`Orchestrator::scope_end`].
    pub fn scope_begin(&mut self, name: &'static str) -> Result<(), UsageError> {
        if self.depth == MAX_SCOPE_DEPTH {
            return Err(UsageError::ScopeTooDeep {
                max: MAX_SCOPE_DEPTH,
            });
        }
        self.scopes[self.depth] = Scope {
            name,
            first: self.next,
        };
        if self.depth == 0 {
            self.held_from = self.next;
        }
        self.depth += 1;
        Ok(())
    }

    /// Closes the innermost scope and lets its tasks retire.
    pub fn scope_end(&mut self) -> Result<(), UsageError> {
        if self.depth == 0 {
            return Err(UsageError::NoOpenScope);
        }
        self.depth -= 1;
        // Tasks of an enclosing scope stay held by it (`held_from`).
        if self.depth == 0 {
            self.held_from = NONE;
            self.retire();
        }
        Ok(())
    }

    /// Proves whether the caller can still make progress when `running`
    /// tasks are on cores and `has_cores[kind]` says which kinds exist.
    /// Called when a submission stays stalled or the caller waits for
    /// completions: if nothing runs and nothing can be handed out, nothing
    /// will ever complete, so waiting longer cannot help.
    pub fn check_progress(
        &self,
        running: usize,
        has_cores: [bool; 2],
    ) -> Result<(), DeadlockReport> {
        if running > 0 {
            return Ok(());
        }
        let runnable = |k: CoreKind| has_cores[k as usize] && self.ready.len(k as usize) > 0;
        if runnable(CoreKind::Cube) || runnable(CoreKind::Vector) {
            return Ok(());
        }
        for kind in [CoreKind::Cube, CoreKind::Vector] {
            if self.ready.len(kind as usize) > 0 {
                return Err(self.report(DeadlockCause::NoCoreForKind { kind }));
            }
        }
        let waiting = (self.head..self.next).any(|id| self.slot(id).state != TaskState::Completed);
        match self.stats.current {
            Some(
                reason @ (StallReason::TaskRingFull
                | StallReason::TensorMapPoolFull
                | StallReason::HeapRingFull),
            ) if self.head < self.next && self.held(self.head) => {
                Err(self.report(self.scope_deadlock(reason)))
            }
            // Nothing in flight: every resource is free (requests larger than
            // a resource were refused as deadlocks), so a retry succeeds. The
            // stall is stale, e.g. a scope ended after it and retired the rest.
            Some(_) if self.is_drained() => Ok(()),
            Some(_) => Err(self.report(DeadlockCause::Stuck)),
            None if waiting => Err(self.report(DeadlockCause::Stuck)),
            None => Ok(()),
        }
    }

    /// [`Orchestrator::check_progress`] for a run on a release graph: a
    /// task the graph released (queued, running, or being queued by the
    /// thread that released it) will complete, so that is progress;
    /// otherwise, if tasks wait and nothing in flight can finish, the
    /// report says why.
    pub fn check_progress_linked<const E: usize>(
        &self,
        graph: &ReleaseGraph<TASKS, E>,
    ) -> Result<(), DeadlockReport> {
        let slot = |id: TaskId| (id % TASKS as u64) as usize;
        let mut waiting = false;
        for id in self.head..self.next {
            if self.slot(id).state == TaskState::Completed {
                continue;
            }
            if graph.released(slot(id)) {
                return Ok(());
            }
            waiting = true;
        }
        let report = |cause| self.report_linked(cause, graph);
        match self.stats.current {
            Some(
                reason @ (StallReason::TaskRingFull
                | StallReason::TensorMapPoolFull
                | StallReason::HeapRingFull),
            ) if self.head < self.next && self.held(self.head) => {
                Err(report(self.scope_deadlock(reason)))
            }
            Some(_) if self.is_drained() => Ok(()),
            Some(_) => Err(report(DeadlockCause::Stuck)),
            None if waiting => Err(report(DeadlockCause::Stuck)),
            None => Ok(()),
        }
    }

    /// `pool` is full and its oldest task is held: by the outermost open
    /// scope that began at or before it.
    fn scope_deadlock(&self, pool: StallReason) -> DeadlockCause {
        let scope = self.scopes[..self.depth]
            .iter()
            .find(|s| s.first <= self.head)
            .unwrap_or(&self.scopes[0]);
        let held = self.next - scope.first.max(self.head);
        match pool {
            StallReason::TaskRingFull => DeadlockCause::ScopeExceedsWindow {
                scope: scope.name,
                window: self.window,
                held,
            },
            _ => DeadlockCause::ScopeExceedsPool {
                scope: scope.name,
                pool,
                held,
            },
        }
    }

    /// The full report for `cause` in the orchestrator's current state.
    pub fn report(&self, cause: DeadlockCause) -> DeadlockReport {
        self.report_in::<0>(cause, None)
    }

    /// [`Orchestrator::report`] for tasks submitted with
    /// [`Orchestrator::submit_linked`]: what each waits on, from `graph`.
    pub fn report_linked<const E: usize>(
        &self,
        cause: DeadlockCause,
        graph: &ReleaseGraph<TASKS, E>,
    ) -> DeadlockReport {
        self.report_in(cause, Some(graph))
    }

    fn report_in<const E: usize>(
        &self,
        cause: DeadlockCause,
        graph: Option<&ReleaseGraph<TASKS, E>>,
    ) -> DeadlockReport {
        let occupancy = |resource, used: u64, capacity: u64| Occupancy {
            resource,
            used,
            capacity,
        };
        let mut report = DeadlockReport {
            cause,
            stalled_on: self.stats.current,
            occupancy: [
                occupancy(StallReason::TaskRingFull, self.in_flight(), self.window),
                occupancy(
                    StallReason::TensorMapPoolFull,
                    self.tmap.used() as u64,
                    TMAP as u64,
                ),
                match graph {
                    None => occupancy(
                        StallReason::DepListPoolFull,
                        self.deps.used() as u64,
                        DEPS as u64,
                    ),
                    Some(_) => occupancy(
                        StallReason::DepListPoolFull,
                        self.edge_alloc - self.edge_free,
                        E as u64,
                    ),
                },
                occupancy(
                    StallReason::HeapRingFull,
                    self.heap.used(),
                    self.heap.capacity(),
                ),
            ],
            in_flight: self.in_flight(),
            blocked: [None; REPORTED_TASKS],
            scopes: [None; MAX_SCOPE_DEPTH],
        };
        let blocked =
            (self.head..self.next).filter(|&id| self.slot(id).state != TaskState::Completed);
        for (out, id) in report.blocked.iter_mut().zip(blocked) {
            let slot = self.slot(id);
            let mut task = BlockedTask {
                id,
                kernel_id: slot.kernel_id,
                state: slot.state,
                waits_on: [None; REPORTED_PRODUCERS],
                producers: 0,
            };
            // Producers are the older live tasks whose fan-out lists name
            // it, and its stream's previous task until that is issued.
            for p in self.head..id {
                let at = |t: TaskId| (t % TASKS as u64) as usize;
                let named = |p: TaskId| match graph {
                    Some(graph) => graph.waits_for(at(id), at(p)),
                    None => {
                        // `id` is live: a slot index names it alone.
                        self.slot(p).stream_next == at(id) as u16
                            || self.slot(p).consumer == at(id) as u16
                            || self.deps.iter(self.slot(p).fanout).any(|c| c == id)
                    }
                };
                if self.is_live(p) && named(p) {
                    if let Some(w) = task.waits_on.get_mut(task.producers as usize) {
                        *w = Some(p);
                    }
                    task.producers += 1;
                }
            }
            *out = Some(task);
        }
        for (out, scope) in report.scopes.iter_mut().zip(&self.scopes[..self.depth]) {
            *out = Some((scope.name, self.next - scope.first));
        }
        report
    }
}

/// One dependency pass of [`Orchestrator::wire`]: counts the distinct live
/// producers of task `id` and, when `commit`, records an edge from each.
/// `COUNTING`: the pass only counts (`commit` is false), and may take less
/// code for the same edges (see `hold_conflict`).
struct Wiring<'a, const TASKS: usize, const DEPS: usize, const E: usize, const COUNTING: bool> {
    slots: &'a mut [Slot; TASKS],
    deps: &'a mut DepPool<DEPS>,
    found: &'a mut [TaskId; FOUND],
    head: TaskId,
    next: TaskId,
    id: TaskId,
    mark: u32,
    commit: bool,
    /// Committing into the release graph rather than the DepList pool.
    graph: Option<&'a ReleaseGraph<TASKS, E>>,
    edge_alloc: &'a mut u64,
    count: u64,
    /// The conflicts the current argument's scan reported so far, held
    /// until its end, when those before `cutoff` are left out: a live
    /// writer of the whole argument orders them already (a chain of
    /// tiles read by a whole-tensor task each round would otherwise link
    /// every later tile write to every such task still in flight). Past
    /// [`HELD`] conflicts the rest of the argument's are linked directly.
    /// Held writers' conflicts are tagged [`WRITER`]; those before
    /// `reader` are left out too: a live reader of the whole argument
    /// orders them already (a tile write after a round whose tiles a
    /// whole-tensor task read would otherwise link to the tile's last
    /// writer as well as to that reader).
    held: &'a mut [TaskId; HELD],
    held_len: usize,
    /// Whether the current argument's conflicts are held (see `held`).
    hold: bool,
    cutoff: TaskId,
    /// One more than the newest live task met that reads all of the
    /// current (written) argument, or 0.
    reader: TaskId,
}

/// Conflicts of one argument held to leave out the implied ones.
const HELD: usize = 16;

/// Producers a counting pass remembers, so that its commit links them
/// without a second scan (more: the commit rescans). As many as the
/// covered entries the TensorMap remembers (its `PENDING`): a task that
/// writes or reads a whole tensor of [`tensor_map::MAX_PROBES`] tiles
/// has a producer per tile. 8 bytes each.
const FOUND: usize = tensor_map::MAX_PROBES as usize + 16;

/// The tag of a held writer's conflict (task numbers stay far below it).
const WRITER: TaskId = 1 << 63;

impl<const TASKS: usize, const DEPS: usize, const E: usize, const COUNTING: bool>
    Wiring<'_, TASKS, DEPS, E, COUNTING>
{
    /// An event wait: a dependency on every live task of `stream` below `bound`.
    /// Inline: called out of line, it would take the pass by reference, and
    /// every field of the pass would live in memory for the whole
    /// submission (on the scheduling bench, 14 to 65 instructions a task).
    #[inline(always)]
    fn stream_tasks(&mut self, stream: StreamId, bound: TaskId) {
        for p in self.head..bound.min(self.next) {
            if self.slots[(p % TASKS as u64) as usize].stream as StreamId == stream && self.live(p)
            {
                self.edge(p);
            }
        }
    }

    /// The current argument's scan has ended: links its held conflicts but
    /// those a live writer of the whole argument orders already.
    #[inline(always)]
    fn end_argument(&mut self) {
        // The cut is the argument's own: reset it even when nothing was
        // held (an argument whose conflicts were not held still reports
        // its covering writer).
        let (held, cutoff, reader) = (self.held_len, self.cutoff, self.reader);
        self.cutoff = 0;
        if held == 0 {
            // `reader` is set only when conflicts are held.
            return;
        }
        self.held_len = 0;
        self.reader = 0;
        // A counting pass that held fewer conflicts than it met links the
        // held ones here, all of them (see `hold_conflict`).
        let all = COUNTING && held > HELD;
        for i in 0..held.min(HELD) {
            let tagged = self.held[i];
            let p = tagged & !WRITER;
            // A writer before a live reader of the whole argument was
            // ordered before that reader.
            let implied = tagged & WRITER != 0 && p + 1 < reader;
            if all || p >= cutoff && !implied {
                self.edge(p);
            }
        }
    }

    /// Holds the conflict with `tagged` (a task, tagged [`WRITER`] for a
    /// writer's) until the argument's end, or links it directly when there
    /// are too many to hold (the argument's conflicts are held).
    #[inline(always)]
    fn hold_conflict(&mut self, tagged: TaskId) {
        let p = tagged & !WRITER;
        if self.held_len < HELD {
            self.held[self.held_len] = tagged;
            self.held_len += 1;
            return;
        }
        if self.held_len == HELD {
            // Too many to hold: link the held ones and the rest directly.
            self.held_len += 1;
            // A counting pass links the held ones at the argument's end
            // instead (`end_argument`), the same edges: this loop is
            // unrolled, an edge's code 16 times over, into each of the
            // pass's inline scans of a chain, and that pass is rare (17 KB
            // of the firmware's code). A committing pass keeps it: without
            // it, the common case's code, unchanged, came out of register
            // allocation 4 to 7 instructions a task slower on the benches
            // (BENCHMARKS.md, eighteenth pass).
            if !COUNTING {
                for i in 0..HELD {
                    self.edge(self.held[i] & !WRITER);
                }
            }
        }
        self.edge(p);
    }
}

impl<const TASKS: usize, const DEPS: usize, const E: usize, const COUNTING: bool> Visitor
    for Wiring<'_, TASKS, DEPS, E, COUNTING>
{
    #[inline(always)]
    fn live(&self, task: TaskId) -> bool {
        live(self.slots, self.next, task)
    }

    #[inline(always)]
    fn conflict(&mut self, p: TaskId) {
        if self.hold {
            self.hold_conflict(p);
        } else {
            self.edge(p);
        }
    }

    #[inline(always)]
    fn writer_conflict(&mut self, p: TaskId) {
        if self.hold {
            self.hold_conflict(p | WRITER);
        } else {
            self.edge(p);
        }
    }

    #[inline(always)]
    fn covering_reader(&mut self, p: TaskId) {
        // Only held conflicts are left out by it (the scan leaves out the
        // writers it meets after the reader itself).
        if self.hold {
            self.reader = self.reader.max(p + 1);
        }
    }

    #[inline(always)]
    fn cut(&mut self, p: TaskId) {
        self.cutoff = self.cutoff.max(p);
    }
}

impl<const TASKS: usize, const DEPS: usize, const E: usize, const COUNTING: bool>
    Wiring<'_, TASKS, DEPS, E, COUNTING>
{
    /// An edge from producer `p`, once per pass: counted and, when
    /// committing, recorded.
    #[inline(always)]
    fn edge(&mut self, p: TaskId) {
        let producer = &mut self.slots[(p % TASKS as u64) as usize];
        if producer.marked_by == self.mark {
            return;
        }
        producer.marked_by = self.mark;
        if let Some(graph) = self.graph {
            // Only edges the graph took count: a producer that completed
            // meanwhile (unknown to the orchestrator yet) gets none.
            let edge = (*self.edge_alloc % E as u64) as usize;
            let at = (self.id % TASKS as u64) as usize;
            if graph.link((p % TASKS as u64) as usize, at, edge) {
                *self.edge_alloc += 1;
                self.count += 1;
            }
            return;
        }
        let at = (self.id % TASKS as u64) as usize;
        if self.commit && linked(producer, self.deps, self.id, at) {
            // Linked earlier in the pass by `commit_tiles`, which marks no
            // producer (see `Tiles::conflict`).
            return;
        }
        if let Some(slot) = self.found.get_mut(self.count as usize) {
            *slot = p;
        }
        self.count += 1;
        if self.commit {
            link(producer, self.deps, self.id, at);
        }
    }
}

/// Where a dependency pass goes on ([`Orchestrator::wire_from`]).
#[derive(Clone, Copy)]
struct Resume {
    /// The first argument not wired yet.
    from: usize,
    /// Its place, if placed already.
    first: Option<Place>,
    /// The pass's mark ([`Orchestrator::next_mark`]).
    mark: u32,
    /// Producers counted so far.
    count: u64,
}

/// A submission's parameters, for [`Orchestrator::submit_rest`].
#[derive(Clone, Copy)]
struct Submission<'a> {
    now: u64,
    stream: StreamId,
    kernel: KernelRef,
    args: &'a [TaskArg],
    heap_bytes: u64,
    extra_deps: &'a [TaskId],
    tag: u64,
}

/// The dependency pass of [`Orchestrator::commit_tiles`]: [`Wiring`]'s
/// committing pass for arguments whose scans are of their home buckets
/// only, which hold no conflicts and remember no producers for a commit.
struct Tiles<'a, const TASKS: usize, const DEPS: usize, const E: usize> {
    slots: &'a mut [Slot; TASKS],
    deps: &'a mut DepPool<DEPS>,
    next: TaskId,
    id: TaskId,
    mark: u32,
    /// Committing into the release graph rather than the DepList pool.
    graph: Option<&'a ReleaseGraph<TASKS, E>>,
    edge_alloc: &'a mut u64,
    /// Edges recorded (with a graph, those it took).
    count: u64,
}

impl<const TASKS: usize, const DEPS: usize, const E: usize> Visitor for Tiles<'_, TASKS, DEPS, E> {
    #[inline(always)]
    fn live(&self, task: TaskId) -> bool {
        live(self.slots, self.next, task)
    }

    /// An edge from producer `p`, once per pass, as [`Wiring`]'s.
    #[inline(always)]
    fn conflict(&mut self, p: TaskId) {
        let producer = &mut self.slots[(p % TASKS as u64) as usize];
        match self.graph {
            Some(graph) => {
                if producer.marked_by == self.mark {
                    return;
                }
                producer.marked_by = self.mark;
                let edge = (*self.edge_alloc % E as u64) as usize;
                let at = (self.id % TASKS as u64) as usize;
                if graph.link((p % TASKS as u64) as usize, at, edge) {
                    *self.edge_alloc += 1;
                    self.count += 1;
                }
            }
            None => {
                let at = (self.id % TASKS as u64) as usize;
                // Before this pass's first edge no producer is linked to
                // the task yet (`count` counts the general pass's too).
                if self.count > 0 && linked(producer, self.deps, self.id, at) {
                    return;
                }
                link(producer, self.deps, self.id, at);
                self.count += 1;
            }
        }
    }
}

/// The dependency pass of [`Orchestrator::commit_beside_wide`]: [`Tiles`]
/// for a tile whose scan is its home bucket, then the wide bucket. A
/// writer that the home bucket holds may have been ordered before a
/// whole-region reader that the wide bucket holds (the tile's previous
/// writer before the last whole-tensor read, in rounds of tiles and a
/// fan-in): so it holds the first writer conflict until the argument's
/// end, as [`Wiring`] holds them all, and leaves it out if a covering
/// reader after it or a covering writer after it was met. Any further
/// conflict is linked at once: an implied edge is redundant, never wrong.
struct BesideWide<'a, const TASKS: usize, const DEPS: usize, const E: usize> {
    tiles: Tiles<'a, TASKS, DEPS, E>,
    /// The writer conflict held, if any.
    held: Option<TaskId>,
    /// One past the newest live reader of all of the region met.
    reader: TaskId,
    /// The newest live writer of all of the region met.
    cutoff: TaskId,
}

impl<const TASKS: usize, const DEPS: usize, const E: usize> BesideWide<'_, TASKS, DEPS, E> {
    /// The argument's scan has ended: links the held writer unless a
    /// covering access after it orders it already.
    #[inline(always)]
    fn end_argument(mut self) -> u64 {
        if let Some(p) = self.held {
            let implied = p + 1 < self.reader || p < self.cutoff;
            if !implied {
                self.tiles.conflict(p);
            }
        }
        self.tiles.count
    }
}

impl<const TASKS: usize, const DEPS: usize, const E: usize> Visitor
    for BesideWide<'_, TASKS, DEPS, E>
{
    #[inline(always)]
    fn live(&self, task: TaskId) -> bool {
        self.tiles.live(task)
    }

    #[inline(always)]
    fn conflict(&mut self, p: TaskId) {
        self.tiles.conflict(p)
    }

    #[inline(always)]
    fn writer_conflict(&mut self, p: TaskId) {
        if self.held.is_none() {
            self.held = Some(p);
        } else {
            self.tiles.conflict(p);
        }
    }

    #[inline(always)]
    fn covering_reader(&mut self, p: TaskId) {
        self.reader = self.reader.max(p + 1);
    }

    #[inline(always)]
    fn cut(&mut self, p: TaskId) {
        self.cutoff = self.cutoff.max(p);
    }
}

/// Records an edge from `producer` to task `consumer` (live, being
/// submitted, in slot `at`): in the producer's slot if it has none yet,
/// else in the DepList pool (room was checked before committing).
#[inline(always)]
fn link<const DEPS: usize>(
    producer: &mut Slot,
    deps: &mut DepPool<DEPS>,
    consumer: TaskId,
    at: usize,
) {
    if producer.consumer == NO_SLOT {
        producer.consumer = at as u16;
        return;
    }
    let pushed = deps.push(&mut producer.fanout, consumer);
    debug_assert!(pushed, "room was checked before committing");
}

/// Whether the pass submitting `consumer` (in slot `at`) linked `producer`
/// to it already: only its edges are linked during its pass, so the
/// producer's newest edge is to it then, in the pool or, with none there,
/// the slot's. A slot index names `consumer` alone: a consumer of a live
/// producer has not retired, so no other task holds its slot.
#[inline(always)]
fn linked<const DEPS: usize>(
    producer: &Slot,
    deps: &DepPool<DEPS>,
    consumer: TaskId,
    at: usize,
) -> bool {
    producer.consumer == at as u16 || deps.starts_with(producer.fanout, consumer)
}

/// Places every argument in the TensorMap ([`TensorMap::place`]), one
/// place each of `places`.
#[inline(always)]
fn place_args<const N: usize>(tmap: &mut TensorMap<N>, args: &[TaskArg], places: &mut [Place]) {
    for (place, a) in places.iter_mut().zip(args) {
        *place = tmap.place(a.tensor, &a.region);
    }
}

/// Inserts every argument of task `id` at its place (room was checked
/// before anything changed).
#[inline(always)]
fn insert_args<const N: usize>(
    tmap: &mut TensorMap<N>,
    args: &[TaskArg],
    places: &[Place],
    id: TaskId,
) {
    for i in 0..MAX_TENSOR_ARGS {
        let (Some(a), Some(place)) = (args.get(i), places.get(i)) else {
            break;
        };
        tmap.push(
            place,
            a.tensor,
            a.region,
            a.access.contains(Access::WRITE),
            id,
        );
    }
}

/// Two arguments of one task that the orchestrator refuses together
/// ([`Invalid::ArgsOverlap`]): regions of one tensor that overlap, at
/// least one of them written. Returns the first such pair (by the later
/// argument's position) as (the one that writes, the other); `None` if
/// there is none. Public so that tools that check tasks before a run
/// (the host's expansion) refuse exactly what a submission refuses.
#[inline(always)]
pub fn overlapping_args(args: &[TaskArg]) -> Option<(usize, usize)> {
    // Most often no two arguments share a tensor: told by the tensors
    // alone, in straight-line compares for the common counts (the pairs'
    // loops cost a three-argument task about 30 instructions).
    let distinct = match args {
        [] | [_] => true,
        [a, b] => a.tensor != b.tensor,
        [a, b, c] => a.tensor != b.tensor && a.tensor != c.tensor && b.tensor != c.tensor,
        _ => false,
    };
    if distinct {
        return None;
    }
    let writes = |a: &TaskArg| a.access.contains(Access::WRITE);
    for index in 1..args.len() {
        let a = &args[index];
        for (other, b) in args[..index].iter().enumerate() {
            if a.tensor == b.tensor && (writes(a) || writes(b)) && a.region.overlaps(&b.region) {
                return Some(if writes(a) {
                    (index, other)
                } else {
                    (other, index)
                });
            }
        }
    }
    None
}

/// Whether task `id` was submitted, has not retired and has not completed.
/// Its slot tells: a slot holds the id of a submitted task (so `id < next`),
/// and a retired task is completed or its slot holds a newer task.
#[inline(always)]
fn live<const T: usize>(slots: &[Slot; T], next: TaskId, id: TaskId) -> bool {
    let slot = &slots[(id % T as u64) as usize];
    debug_assert!(
        slot.id != id || id <= next,
        "a slot holds a submitted task, or the one being submitted"
    );
    slot.id == id && slot.state != TaskState::Completed
}
