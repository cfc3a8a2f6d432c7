//! What a traced run records on the host: each task's core, scheduler
//! thread and times, which task released which, and the dispatcher's
//! stalls and queue depths, from the [`Event`]s the device runtime's
//! scheduler reports to an observing platform.
//!
//! [`Observed`] wraps a scheduler thread's platform: it answers
//! [`Platform::observing`] with `true` and keeps the thread's events in a
//! log of its own (no lock, no sharing while the run goes), which it hands
//! to the run's [`Sink`] when the scheduler drops it at the end of the
//! run. Untraced runs use their platform unwrapped, whose `observing` is
//! the constant `false`: the scheduler builds no event at all.
//!
//! Times are the platform clock's ticks when the scheduler saw the event:
//! a task starts when it was issued to an idle core, or when the scheduler
//! saw the task before it on the core finish. In semantic time these are
//! exact (the clock moves only to the next completion); on the shim they
//! are wall nanoseconds, late by as much as the scheduler's round.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use device_runtime::platform::{Clock, Completion, Event, Platform};
use wsp_ffi::{CoreKind, WspKernelArgs};

/// One task of a traced run.
#[derive(Clone, Debug)]
pub struct TaskSpan {
    /// Its number in the run.
    pub task: u32,
    /// The run-wide core it ran on.
    pub core: usize,
    /// The scheduler thread that issued it.
    pub thread: usize,
    /// The kernel.
    pub kernel_id: u32,
    /// When it was handed to its core.
    pub issued: u64,
    /// When it started: `issued`, or the end of the task before it on its
    /// core if that was later.
    pub start: u64,
    /// When the scheduler saw it finish.
    pub end: u64,
    /// The cycles its kernel reported.
    pub cycles: u64,
    /// Its arguments (tensor views and scalars).
    pub args: WspKernelArgs,
    /// The indices of the program loops around its call, outermost first
    /// (none for a task of the tasks section).
    pub loops: Vec<u32>,
}

/// The dispatcher's state when it changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DispatcherSample {
    /// When (clock ticks).
    pub at: u64,
    /// What submissions or placements waited for, if anything (a
    /// [`StallReason`](device_runtime::orch::StallReason)'s name).
    pub stall: Option<&'static str>,
    /// Tasks submitted and not retired.
    pub in_flight: u64,
    /// Ready tasks in the dispatch queues.
    pub queued: u64,
}

/// What a traced run recorded.
#[derive(Clone, Debug, Default)]
pub struct Recording {
    /// Every task, by task number.
    pub tasks: Vec<TaskSpan>,
    /// `(by, task)`: task `by` released `task`.
    pub releases: Vec<(u32, u32)>,
    /// The dispatcher's state at each change, in time order.
    pub dispatcher: Vec<DispatcherSample>,
    /// The kinds of the run's cores (core `c` is `kinds[c]`).
    pub kinds: Vec<CoreKind>,
    /// The scheduler thread of each core.
    pub core_threads: Vec<usize>,
    /// Scheduler threads.
    pub threads: usize,
    /// The clock's ticks per second.
    pub ticks_per_second: u64,
    /// Whether the clock is semantic cycles (else wall nanoseconds).
    pub semantic: bool,
}

/// One scheduler thread's log.
#[derive(Debug, Default)]
struct Log {
    tasks: Vec<TaskSpan>,
    releases: Vec<(u32, u32)>,
    dispatcher: Vec<DispatcherSample>,
}

/// Where the threads' logs go at the end of a run, and the count of
/// finished tasks while it goes (for a progress bar).
#[derive(Debug, Default)]
pub struct Sink {
    logs: Mutex<Vec<Log>>,
    /// Each submitted task's number and loop indices.
    loops: Mutex<Vec<(u32, Vec<u32>)>>,
    /// Tasks seen finished so far, by every thread.
    pub finished: AtomicU64,
    /// Whether to keep the events (else only count finished tasks).
    keep: bool,
}

impl Sink {
    /// A sink that keeps every event (`keep`), or only counts finished
    /// tasks.
    pub fn new(keep: bool) -> Self {
        Sink {
            keep,
            ..Sink::default()
        }
    }

    /// Whether it keeps events (else it only counts finished tasks).
    pub fn keeps(&self) -> bool {
        self.keep
    }

    /// Adds the loop indices of submitted tasks, `(task, loops)`, as the
    /// dispatcher reported them ([`device_runtime::sched::Dispatcher::observe_submissions`]).
    pub fn add_loops(&self, loops: Vec<(u32, Vec<u32>)>) {
        let mut all = self.loops.lock().unwrap_or_else(|e| e.into_inner());
        all.extend(loops);
    }

    /// The run's recording, from the logs of the threads (whose platforms
    /// have been dropped), for `kinds` cores, core `c` on scheduler thread
    /// `core_threads[c]`.
    pub fn recording(
        &self,
        kinds: &[CoreKind],
        core_threads: &[usize],
        ticks_per_second: u64,
        semantic: bool,
    ) -> Recording {
        let logs = std::mem::take(&mut *self.logs.lock().unwrap_or_else(|e| e.into_inner()));
        let mut rec = Recording {
            kinds: kinds.to_vec(),
            core_threads: core_threads.to_vec(),
            threads: core_threads.iter().max().map_or(1, |t| t + 1),
            ticks_per_second,
            semantic,
            ..Recording::default()
        };
        for log in logs {
            rec.tasks.extend(log.tasks);
            rec.releases.extend(log.releases);
            // Only one thread runs the dispatcher.
            rec.dispatcher.extend(log.dispatcher);
        }
        // A task starts when the one before it on its core ended, if that
        // was after its issue (it was queued behind it). "Before" is issue
        // order: a core's tasks are all in its thread's log, in the order
        // they were issued, and the sort is stable. (Not the task number:
        // one round can issue a task to an idle core and then an older one
        // behind it, both at the round's time.)
        rec.tasks.sort_by_key(|t| (t.core, t.issued));
        for i in 1..rec.tasks.len() {
            let (core, end) = (rec.tasks[i - 1].core, rec.tasks[i - 1].end);
            let this = &mut rec.tasks[i];
            if core == this.core {
                this.start = this.issued.max(end);
            }
        }
        rec.tasks.sort_by_key(|t| t.task);
        let loops = std::mem::take(&mut *self.loops.lock().unwrap_or_else(|e| e.into_inner()));
        for (task, loops) in loops {
            if let Ok(i) = rec.tasks.binary_search_by_key(&task, |t| t.task) {
                rec.tasks[i].loops = loops;
            }
        }
        rec.releases.sort_unstable();
        rec.dispatcher.sort_by_key(|s| s.at);
        rec
    }
}

/// A scheduler thread's platform, recording what the scheduler reports
/// into its own log, handed to the sink when dropped.
pub struct Observed<'s, P> {
    inner: P,
    sink: &'s Sink,
    thread: usize,
    /// Run-wide numbers of the platform's cores.
    cores: Vec<usize>,
    log: Log,
    /// The last launch handed to the platform (its task number comes
    /// with the `Issued` event right after it).
    launched: Option<(u32, WspKernelArgs)>,
    /// Per core, the indices into `log.tasks` of the tasks it holds, and
    /// the cycles of the completion last polled.
    held: Vec<VecDeque<usize>>,
    polled: Vec<u64>,
}

impl<'s, P: Platform> Observed<'s, P> {
    /// `inner`, the platform of scheduler thread `thread` whose cores the
    /// run numbers `cores`, recording into `sink`.
    pub fn new(inner: P, sink: &'s Sink, thread: usize, cores: &[usize]) -> Self {
        Observed {
            inner,
            sink,
            thread,
            cores: cores.to_vec(),
            log: Log::default(),
            launched: None,
            held: vec![VecDeque::new(); cores.len()],
            polled: vec![0; cores.len()],
        }
    }
}

impl<P> Drop for Observed<'_, P> {
    fn drop(&mut self) {
        if self.sink.keep {
            let log = std::mem::take(&mut self.log);
            self.sink
                .logs
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(log);
        }
    }
}

impl<P: Platform> Clock for Observed<'_, P> {
    fn now(&self) -> u64 {
        self.inner.now()
    }
    fn ticks_per_second(&self) -> u64 {
        self.inner.ticks_per_second()
    }
    fn relax(&self) {
        self.inner.relax()
    }
    fn pause(&self) {
        self.inner.pause()
    }
    fn relax_until(&self, deadline: u64) {
        self.inner.relax_until(deadline)
    }
}

impl<P: Platform> Platform for Observed<'_, P> {
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
    unsafe fn launch(&mut self, core: usize, kernel_id: u32, args: &WspKernelArgs) -> bool {
        // SAFETY: the caller upholds the same contract.
        let taken = unsafe { self.inner.launch(core, kernel_id, args) };
        if taken && self.sink.keep {
            self.launched = Some((kernel_id, *args));
        }
        taken
    }
    fn acknowledged(&self, core: usize) -> bool {
        self.inner.acknowledged(core)
    }
    fn has_kernel(&self, core: usize, kernel_id: u32) -> bool {
        self.inner.has_kernel(core, kernel_id)
    }
    fn poll(&mut self, core: usize) -> Option<Completion> {
        let completion = self.inner.poll(core)?;
        if let Completion::Done { cycles } = completion {
            if let Some(p) = self.polled.get_mut(core) {
                *p = cycles;
            }
        }
        Some(completion)
    }
    fn observing(&self) -> bool {
        true
    }
    fn observe(&mut self, event: Event) {
        if let Event::Finished { .. } = event {
            self.sink.finished.fetch_add(1, Ordering::Relaxed);
        }
        if !self.sink.keep {
            return;
        }
        match event {
            Event::Issued { core, task, now } => {
                let Some((kernel_id, args)) = self.launched.take() else {
                    return;
                };
                let Some(&global) = self.cores.get(core) else {
                    return;
                };
                self.held[core].push_back(self.log.tasks.len());
                self.log.tasks.push(TaskSpan {
                    task,
                    core: global,
                    thread: self.thread,
                    kernel_id,
                    issued: now,
                    start: now,
                    end: now,
                    cycles: 0,
                    args,
                    loops: Vec::new(),
                });
            }
            Event::Finished { core, task, now } => {
                let Some(i) = self.held.get_mut(core).and_then(VecDeque::pop_front) else {
                    return;
                };
                let span = &mut self.log.tasks[i];
                debug_assert_eq!(span.task, task, "completions come in launch order");
                span.end = now;
                span.cycles = self.polled[core];
            }
            Event::Released { by, task } => self.log.releases.push((by, task)),
            Event::Dispatcher {
                now,
                stall,
                in_flight,
                queued,
            } => {
                let last = self.log.dispatcher.last();
                if last
                    .is_none_or(|s| (s.stall, s.in_flight, s.queued) != (stall, in_flight, queued))
                {
                    self.log.dispatcher.push(DispatcherSample {
                        at: now,
                        stall,
                        in_flight,
                        queued,
                    });
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One core that takes two tasks at once and finishes each when told.
    struct TwoDeep {
        now: u64,
        done: VecDeque<u64>,
    }

    impl Clock for TwoDeep {
        fn now(&self) -> u64 {
            self.now
        }
        fn ticks_per_second(&self) -> u64 {
            1_000_000_000
        }
    }

    impl Platform for TwoDeep {
        fn num_cores(&self) -> usize {
            1
        }
        fn core_kind(&self, _: usize) -> CoreKind {
            CoreKind::Vector
        }
        unsafe fn launch(&mut self, _: usize, _: u32, _: &WspKernelArgs) -> bool {
            true
        }
        fn poll(&mut self, _: usize) -> Option<Completion> {
            self.done
                .pop_front()
                .map(|cycles| Completion::Done { cycles })
        }
    }

    /// A round issues task 5 to the idle core and then the older task 3
    /// behind it, both at time 10; 5 finishes at 20, 3 at 30. By hand: 5
    /// runs 10..20, 3 waits for it and runs 20..30. (Ordered by task
    /// number instead of issue, 5 would start when 3 ended, at 30, after
    /// its own end.)
    #[test]
    fn a_task_issued_behind_a_newer_one_starts_when_that_one_ends() {
        let sink = Sink::new(true);
        {
            let platform = TwoDeep {
                now: 10,
                done: VecDeque::from([1, 2]),
            };
            let mut p = Observed::new(platform, &sink, 0, &[0]);
            let args = WspKernelArgs {
                num_tensors: 0,
                num_scalars: 0,
                tensors: [device_runtime::expand::NO_VIEW; 4],
                scalars: [0; 4],
            };
            for task in [5, 3] {
                // SAFETY: the test platform touches no memory.
                assert!(unsafe { p.launch(0, 1, &args) });
                p.observe(Event::Issued {
                    core: 0,
                    task,
                    now: 10,
                });
            }
            for (task, now) in [(5, 20), (3, 30)] {
                assert!(p.poll(0).is_some());
                p.observe(Event::Finished { core: 0, task, now });
            }
        }
        let rec = sink.recording(&[CoreKind::Vector], &[0], 1_000_000_000, false);
        let spans: Vec<(u32, u64, u64)> =
            rec.tasks.iter().map(|t| (t.task, t.start, t.end)).collect();
        assert_eq!(spans, [(3, 20, 30), (5, 10, 20)]);
    }
}
