//! Run traces (the semihosting command-line word `trace`): each scheduler
//! thread records its events into its own byte queue ([`QUEUES`], a
//! `bbqueue`, so one producer each), without blocking: when its queue is
//! full an event is dropped and counted ([`DROPPED`]). After the run CPU 0
//! drains every queue into the semihosting file [`TRACE_FILE`], which
//! `cargo xtask qemu --trace` turns into a Chrome trace-event file.
//!
//! Without `trace` nothing is recorded: the [`Traced`] platform checks one
//! flag per launch and poll and reads no clock.
//!
//! Events (ticks of the generic timer, at the header's frequency):
//! - task: a task on an AICore, from when it could start (its launch, or
//!   the end of the task before it on that core) to when its scheduler
//!   thread saw it finish;
//! - issue: a scheduler thread handing a task to a core (the launch);
//! - thread: a scheduler thread's whole run;
//! - idle: a scheduler thread waiting (its rounds found nothing to do, so
//!   it relaxed or paused) until its next launch or completion: the
//!   thread's stalls, whatever held the work back.
//!
//! The file (little-endian): the magic `WSPT`, a u32 version (2), a u64
//! timer frequency, a u64 base tick (when tracing began: the records' times
//! count from it), a u32 count of scheduler threads `n`, a u32 record size
//! ([`RECORD_BYTES`]), `n` u32 counts of events dropped by each thread, then
//! records of 24 bytes: a u8 of the kind (0 task, 1 issue, 2 thread, 3 idle)
//! in its low four bits and the thread in its high four, u8 run core, u16
//! kernel id, u32 task key ([`task_key`]), u32 kernel cycles, u48 start and
//! u48 end (ticks after the base). Each field is as wide as its values need
//! (4 threads, 4 run cores, a registry of kernels numbered from 0, 2^48
//! ticks are days at any timer rate); a wider value saturates (kernel
//! cycles at 2^32 - 1, the rest at their type's maximum).

use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use bbqueue::nicknames::Churrasco;
use bbqueue::prod_cons::stream::StreamProducer;
use device_runtime::platform::{Clock, Completion, Platform};
use heapless::Deque;
use semihosting::fs::File;
use semihosting::io::{self, Write};
use wsp_ffi::{CoreKind, WspKernelArgs};

use device_runtime::abi::memory_map::ARENA_ADDR;

use crate::{AICPUS, WORKERS};

/// Tasks of one scheduler thread whose events always fit its queue; past
/// them, events may be dropped (and counted).
pub const QUEUE_TASKS: usize = 128;
/// Records each scheduler thread's queue holds: the most that
/// [`QUEUE_TASKS`] tasks can make. A task has an issue and a task event, and
/// the thread idles at most once before each launch or completion it sees
/// and once before its run's end (a spell ends at the next of them), then
/// records its run: 4 x 128 + 2 = 514 (a run whose thread idles once a task
/// fits 171 tasks).
pub const QUEUE_RECORDS: usize = 4 * QUEUE_TASKS + 2;
/// Bytes of one record.
pub const RECORD_BYTES: usize = 24;
/// Bytes of each scheduler thread's queue: 4 threads x 12,336 bytes of
/// `.bss`, inside the image's 2 MiB budget with the 4,096-task window.
pub const QUEUE_BYTES: usize = QUEUE_RECORDS * RECORD_BYTES;
/// The largest time a record holds (48 bits of ticks after the base).
const TICKS_MAX: u64 = (1 << 48) - 1;
const _: () = assert!(
    AICPUS <= 16 && WORKERS <= 255,
    "threads and run cores fit their fields"
);
/// The semihosting file the trace goes to.
pub const TRACE_FILE: &core::ffi::CStr = c"trace.out";
/// `Traced::idle_since` when the thread is not idle.
const NOT_IDLE: u64 = u64::MAX;
/// Tasks a core holds at most (the mailbox's depth is 2).
const HELD_MAX: usize = 4;

/// One queue per scheduler thread: only that thread writes it.
static QUEUES: [Churrasco<QUEUE_BYTES>; AICPUS] = [const { Churrasco::new() }; AICPUS];
/// Events each scheduler thread dropped because its queue was full.
static DROPPED: [AtomicU32; AICPUS] = [const { AtomicU32::new(0) }; AICPUS];
/// Whether this run is traced; set by CPU 0 before the run starts.
static ENABLED: AtomicBool = AtomicBool::new(false);
/// The tick tracing began at ([`enable`]): records count their times from it.
static BASE: AtomicU64 = AtomicU64::new(0);

/// Turns tracing on for the run at tick `now` (CPU 0, before it builds the
/// schedulers).
pub fn enable(now: u64) {
    BASE.store(now, Ordering::Relaxed);
    ENABLED.store(true, Ordering::Relaxed);
}

/// What an event is.
#[derive(Clone, Copy)]
#[repr(u8)]
enum Kind {
    Task = 0,
    Issue = 1,
    Thread = 2,
    Idle = 3,
}

/// One event.
struct Event {
    kind: Kind,
    core: u16,
    /// The task's [`task_key`] (tasks and issues).
    key: u32,
    kernel: u32,
    cycles: u64,
    start: u64,
    end: u64,
}

/// Where scheduler thread `thread` records its events.
pub struct Recorder {
    thread: u16,
    producer: Option<StreamProducer<&'static Churrasco<QUEUE_BYTES>>>,
    /// [`BASE`], kept at hand.
    base: u64,
}

impl Recorder {
    /// The recorder of scheduler thread `thread` (one per thread and run):
    /// records only if the run is traced.
    fn new(thread: usize) -> Self {
        let producer = (ENABLED.load(Ordering::Relaxed) && thread < AICPUS)
            .then(|| QUEUES[thread].stream_producer());
        Recorder {
            thread: thread as u16,
            producer,
            base: BASE.load(Ordering::Relaxed),
        }
    }

    fn on(&self) -> bool {
        self.producer.is_some()
    }

    fn record(&self, e: &Event) {
        let Some(producer) = &self.producer else {
            return;
        };
        let Ok(mut grant) = producer.grant_exact(RECORD_BYTES) else {
            DROPPED[usize::from(self.thread)].fetch_add(1, Ordering::Relaxed);
            return;
        };
        // The thread is below AICPUS (16 at most): its four bits.
        grant[0] = e.kind as u8 | (self.thread as u8) << 4;
        grant[1] = u8::try_from(e.core).unwrap_or(u8::MAX);
        let kernel = u16::try_from(e.kernel).unwrap_or(u16::MAX);
        grant[2..4].copy_from_slice(&kernel.to_le_bytes());
        grant[4..8].copy_from_slice(&e.key.to_le_bytes());
        let cycles = u32::try_from(e.cycles).unwrap_or(u32::MAX);
        grant[8..12].copy_from_slice(&cycles.to_le_bytes());
        let ticks = |t: u64| t.saturating_sub(self.base).min(TICKS_MAX).to_le_bytes();
        grant[12..18].copy_from_slice(&ticks(e.start)[..6]);
        grant[18..24].copy_from_slice(&ticks(e.end)[..6]);
        grant.commit(RECORD_BYTES);
    }
}

/// A platform that records, when the run is traced, each launch (an issue
/// event) and each task's time on its core (a task event).
pub struct Traced<P> {
    inner: P,
    recorder: Recorder,
    /// The run core of each of this platform's cores.
    cores: [u16; WORKERS],
    /// Per core, the tasks it holds: kernel id, task key and launch tick.
    held: [Deque<(u32, u32, u64), HELD_MAX>; WORKERS],
    /// Per core, when the last task it ran was seen to finish.
    last_end: [u64; WORKERS],
    /// Since when the thread has found nothing to do, if it has not since
    /// launched a task or seen one finish; [`NOT_IDLE`] if it has. (An
    /// atomic only because the scheduler is shared once handed back; only
    /// its own thread touches it.)
    idle_since: AtomicU64,
    /// Whether the run is traced (the recorder's, kept at hand).
    traced: bool,
}

impl<P: Platform> Traced<P> {
    /// `inner`, driven by scheduler thread `thread`, its core `i` being run
    /// core `cores[i]`.
    pub fn new(inner: P, thread: usize, cores: &[u16]) -> Self {
        let mut run_cores = [0; WORKERS];
        for (slot, &c) in run_cores.iter_mut().zip(cores) {
            *slot = c;
        }
        let recorder = Recorder::new(thread);
        Traced {
            inner,
            cores: run_cores,
            held: [const { Deque::new() }; WORKERS],
            last_end: [0; WORKERS],
            idle_since: AtomicU64::new(NOT_IDLE),
            traced: recorder.on(),
            recorder,
        }
    }

    /// The thread found nothing to do: an idle spell starts, unless one
    /// has. (Untraced, one test of a flag: the recording is out of line.)
    #[inline(always)]
    fn idle(&self) {
        if self.traced {
            self.start_idle();
        }
    }

    #[inline(never)]
    fn start_idle(&self) {
        if self.idle_since.load(Ordering::Relaxed) == NOT_IDLE {
            self.idle_since.store(self.inner.now(), Ordering::Relaxed);
        }
    }

    /// The thread made progress at `now`: its idle spell, if any, ends.
    fn busy(&self, now: u64) {
        let start = self.idle_since.swap(NOT_IDLE, Ordering::Relaxed);
        if start != NOT_IDLE {
            self.recorder.record(&Event {
                kind: Kind::Idle,
                core: 0,
                key: 0,
                kernel: 0,
                cycles: 0,
                start,
                end: now,
            });
        }
    }

    /// Records the thread's run, from `start` to `end` (and ends its idle
    /// spell).
    pub fn record_run(&self, start: u64, end: u64) {
        self.busy(end);
        self.recorder.record(&Event {
            kind: Kind::Thread,
            core: 0,
            key: 0,
            kernel: 0,
            cycles: 0,
            start,
            end,
        });
    }
}

impl<P: Platform> Clock for Traced<P> {
    fn now(&self) -> u64 {
        self.inner.now()
    }
    fn ticks_per_second(&self) -> u64 {
        self.inner.ticks_per_second()
    }
    #[inline]
    fn relax(&self) {
        self.idle();
        self.inner.relax()
    }
    #[inline]
    fn pause(&self) {
        self.idle();
        self.inner.pause()
    }
    fn relax_until(&self, deadline: u64) {
        self.idle();
        self.inner.relax_until(deadline)
    }
}

impl<P: Platform> Platform for Traced<P> {
    fn num_cores(&self) -> usize {
        self.inner.num_cores()
    }
    fn core_kind(&self, core: usize) -> CoreKind {
        self.inner.core_kind(core)
    }
    fn depth(&self) -> usize {
        self.inner.depth()
    }
    fn can_queue(&self, core: usize) -> bool {
        self.inner.can_queue(core)
    }

    #[inline]
    unsafe fn launch(&mut self, core: usize, kernel_id: u32, args: &WspKernelArgs) -> bool {
        if self.traced {
            // SAFETY: the caller's contract, passed on unchanged.
            unsafe { self.launch_traced(core, kernel_id, args) }
        } else {
            // SAFETY: the caller's contract, passed on unchanged.
            unsafe { self.inner.launch(core, kernel_id, args) }
        }
    }

    #[inline]
    fn acknowledged(&self, core: usize) -> bool {
        self.inner.acknowledged(core)
    }
    fn has_kernel(&self, core: usize, kernel_id: u32) -> bool {
        self.inner.has_kernel(core, kernel_id)
    }
    fn poll(&mut self, core: usize) -> Option<Completion> {
        let completion = self.inner.poll(core)?;
        if self.traced {
            self.completed(core, completion);
        }
        Some(completion)
    }
}

impl<P: Platform> Traced<P> {
    /// [`Platform::launch`], recording the issue and when the task was
    /// handed over.
    ///
    /// # Safety
    /// As [`Platform::launch`].
    #[inline(never)]
    unsafe fn launch_traced(&mut self, core: usize, kernel_id: u32, args: &WspKernelArgs) -> bool {
        let start = self.inner.now();
        // SAFETY: the caller's contract, passed on unchanged.
        let taken = unsafe { self.inner.launch(core, kernel_id, args) };
        if taken {
            self.busy(start);
            let key = task_key(kernel_id, args);
            let end = self.inner.now();
            self.recorder.record(&Event {
                kind: Kind::Issue,
                core: self.run_core(core),
                key,
                kernel: kernel_id,
                cycles: 0,
                start,
                end,
            });
            if let Some(held) = self.held.get_mut(core) {
                // A full list (more tasks than a core holds) loses the
                // task's event, as a full queue would.
                if held.push_back((kernel_id, key, end)).is_err() {
                    DROPPED[usize::from(self.recorder.thread)].fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        taken
    }

    /// Records the task of `core` that `completion` reports.
    #[inline(never)]
    fn completed(&mut self, core: usize, completion: Completion) {
        let end = self.inner.now();
        self.busy(end);
        let Some((kernel, key, launched)) = self.held.get_mut(core).and_then(Deque::pop_front)
        else {
            return;
        };
        let start = launched.max(self.last_end[core]);
        // A task the kernel refused or failed held the core too: the
        // next one starts after it, recorded or not.
        self.last_end[core] = end;
        if let Completion::Done { cycles } = completion {
            self.recorder.record(&Event {
                kind: Kind::Task,
                core: self.run_core(core),
                key,
                kernel,
                cycles,
                start,
                end,
            });
        }
    }
}

impl<P> Traced<P> {
    fn run_core(&self, core: usize) -> u16 {
        self.cores.get(core).copied().unwrap_or(u16::MAX)
    }
}

/// Which task a launch is, the same in every runner: FNV-1a (32 bits)
/// over the little-endian bytes of the kernel id (u32), then of each tensor
/// view its arguments use, its address as an offset into the arena (u64),
/// rows, columns, row stride and dtype (u32 each), then of each scalar
/// (u64). Two tasks with the same key do the same work on the same data.
fn task_key(kernel_id: u32, args: &WspKernelArgs) -> u32 {
    const PRIME: u32 = 0x0100_0193;
    let mut hash: u32 = 0x811c_9dc5;
    let mut eat = |bytes: &[u8]| {
        for &b in bytes {
            hash = (hash ^ u32::from(b)).wrapping_mul(PRIME);
        }
    };
    eat(&kernel_id.to_le_bytes());
    let views = args.tensors.iter().take(args.num_tensors as usize);
    for v in views {
        eat(&v.addr.wrapping_sub(ARENA_ADDR as u64).to_le_bytes());
        for field in [v.rows, v.cols, v.row_stride, v.dtype] {
            eat(&field.to_le_bytes());
        }
    }
    for s in args.scalars.iter().take(args.num_scalars as usize) {
        eat(&s.to_le_bytes());
    }
    hash
}

/// Writes the trace of a run with `threads` scheduler threads to
/// [`TRACE_FILE`] (CPU 0, after every thread has finished).
pub fn write(threads: usize, ticks_per_second: u64) -> io::Result<()> {
    let threads = threads.min(AICPUS);
    let mut file = File::create(TRACE_FILE)?;
    file.write_all(b"WSPT")?;
    file.write_all(&2u32.to_le_bytes())?;
    file.write_all(&ticks_per_second.to_le_bytes())?;
    file.write_all(&BASE.load(Ordering::Relaxed).to_le_bytes())?;
    file.write_all(&(threads as u32).to_le_bytes())?;
    file.write_all(&(RECORD_BYTES as u32).to_le_bytes())?;
    for dropped in &DROPPED[..threads] {
        file.write_all(&dropped.load(Ordering::Relaxed).to_le_bytes())?;
    }
    for queue in &QUEUES[..threads] {
        let consumer = queue.stream_consumer();
        // The data may wrap around the queue's end: two reads at most.
        while let Ok(grant) = consumer.read() {
            file.write_all(&grant)?;
            let len = grant.len();
            grant.release(len);
        }
    }
    Ok(())
}
