//! The dispatcher: submits a table's tasks to the orchestrator in program
//! order, collects completions from the scheduler threads, and places ready
//! tasks in dispatch queues by the run's policy.

use wsp_ffi::CoreKind;

use super::policy::{DispatchKey, DispatchPolicy, Load, Placement, TaskInfo, MAX_THREADS};
use super::{ConfigError, Queues, SchedConfig, DISPATCH_QUEUE, ISSUED, RUNNING};
use crate::abi::{Access, Region, Table, MAX_TENSOR_ARGS, STREAM_OP_RECORD};
use crate::exec::{RunError, RunStats, TableOrchestrator};
use crate::orch::{KernelRef, ReadyTask, ResourceStats, StallReason, SubmitError, TaskArg, TaskId};
use crate::steal_deque::Owner;
use crate::sync::Ordering;

/// Where a placed task goes: a thread's queue or the shared one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Target {
    Thread(usize),
    Shared,
}

/// Per-thread figures the dispatcher keeps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DispatchStats {
    /// Tasks placed in the thread's queues.
    pub placed: u64,
    /// Most tasks its queues (both kinds) held at once.
    pub queue_high_water: u64,
}

/// The dispatcher of one run (thread 0's half of the work).
pub struct Dispatcher<'a> {
    table: &'a Table<'a>,
    orch: &'a mut TableOrchestrator,
    queues: &'a Queues,
    owners: [[Option<Owner<'a, DISPATCH_QUEUE>>; 2]; MAX_THREADS],
    shared: [Option<Owner<'a, DISPATCH_QUEUE>>; 2],
    policy: &'a mut dyn DispatchPolicy,
    key: DispatchKey,
    depth: usize,
    threads: usize,
    /// Per kind, the threads that own cores of it.
    eligible: [[usize; MAX_THREADS]; 2],
    eligible_count: [usize; 2],
    /// Task id of table task 0.
    base: TaskId,
    /// Next table task to submit.
    next: usize,
    /// Next stream op to apply (before table task `next`).
    next_op: usize,
    /// Tasks placed and not yet collected as finished.
    outstanding: u64,
    /// Per kind, a ready task whose queue was full, and where it goes.
    held: [Option<(ReadyTask, Target)>; 2],
    ready_queue: ResourceStats,
    stalled_since: Option<u64>,
    per_thread: [DispatchStats; MAX_THREADS],
}

impl<'a> Dispatcher<'a> {
    /// A dispatcher for running `table` with `arena_len` bytes of data
    /// arena, `orch` (which must hold no tasks) and threads whose core kinds
    /// are `thread_kinds[t] = [has cube cores, has vector cores]`. Start the
    /// other threads after this returns: it marks `queues` running.
    pub fn new(
        table: &'a Table<'a>,
        arena_len: u64,
        orch: &'a mut TableOrchestrator,
        queues: &'a Queues,
        policy: &'a mut dyn DispatchPolicy,
        config: &SchedConfig,
        thread_kinds: &[[bool; 2]],
    ) -> Result<Self, RunError> {
        if arena_len < table.arena_size() {
            return Err(RunError::ArenaTooSmall {
                needed: table.arena_size(),
                available: arena_len,
            });
        }
        if !orch.is_drained() {
            return Err(RunError::OrchestratorBusy {
                in_flight: orch.in_flight(),
            });
        }
        let threads = config.threads;
        if threads == 0 || threads > MAX_THREADS || thread_kinds.len() != threads {
            return Err(RunError::Config(ConfigError::Threads {
                threads,
                max: MAX_THREADS,
            }));
        }
        if config.queue_depth == 0 || config.queue_depth > DISPATCH_QUEUE {
            return Err(RunError::Config(ConfigError::QueueDepth {
                depth: config.queue_depth,
                max: DISPATCH_QUEUE,
            }));
        }
        let mut eligible = [[0; MAX_THREADS]; 2];
        let mut eligible_count = [0; 2];
        for (thread, kinds) in thread_kinds.iter().enumerate() {
            if !kinds[0] && !kinds[1] {
                return Err(RunError::Config(ConfigError::ThreadWithoutCores { thread }));
            }
            for kind in 0..2 {
                if kinds[kind] {
                    eligible[kind][eligible_count[kind]] = thread;
                    eligible_count[kind] += 1;
                }
            }
        }
        let in_use = RunError::Config(ConfigError::QueuesInUse);
        let mut owners = [const { [const { None }; 2] }; MAX_THREADS];
        for (owner, deque) in owners
            .iter_mut()
            .flatten()
            .zip(queues.ready.iter().flatten())
        {
            if !deque.is_empty() {
                return Err(in_use);
            }
            *owner = Some(deque.claim_owner().map_err(|_| in_use)?);
        }
        let mut shared = [const { None }; 2];
        for (owner, deque) in shared.iter_mut().zip(&queues.shared) {
            if !deque.is_empty() {
                return Err(in_use);
            }
            *owner = Some(deque.claim_owner().map_err(|_| in_use)?);
        }
        if queues.done.iter().any(|r| !r.is_empty()) {
            return Err(in_use);
        }
        orch.clear_streams();
        queues.stealing.store(policy.steals(), Ordering::Release);
        queues.starved.store(0, Ordering::Relaxed);
        queues.state.store(RUNNING, Ordering::Release);
        Ok(Dispatcher {
            table,
            base: orch.submitted(),
            orch,
            queues,
            owners,
            shared,
            policy,
            key: config.key,
            depth: config.queue_depth,
            threads,
            eligible,
            eligible_count,
            next: 0,
            next_op: 0,
            outstanding: 0,
            held: [None; 2],
            ready_queue: ResourceStats {
                capacity: config.queue_depth as u64,
                ..ResourceStats::default()
            },
            stalled_since: None,
            per_thread: [DispatchStats::default(); MAX_THREADS],
        })
    }

    pub fn queues(&self) -> &'a Queues {
        self.queues
    }

    /// Every table task has run and retired.
    pub fn finished(&self) -> bool {
        self.next == self.table.tasks().len() && self.orch.is_drained()
    }

    /// One round: collect completions, submit, place ready tasks. Returns
    /// whether anything happened.
    pub fn step(&mut self, now: u64) -> Result<bool, RunError> {
        let mut progress = self.collect();
        progress |= self.submit(now)?;
        progress |= self.dispatch(now)?;
        Ok(progress)
    }

    /// Called when a round of every thread did nothing: if no task is
    /// queued or running, nothing can ever complete, and the orchestrator
    /// proves whether that is the end or a deadlock.
    pub fn check_progress(&self) -> Result<(), RunError> {
        let held = self.held.iter().flatten().count() as u64;
        if self.outstanding + held > 0 {
            return Ok(());
        }
        let has_cores = [self.eligible_count[0] > 0, self.eligible_count[1] > 0];
        self.orch
            .check_progress(0, has_cores)
            .map_err(RunError::Deadlock)
    }

    fn collect(&mut self) -> bool {
        let mut any = false;
        for ring in &self.queues.done[..self.threads] {
            while let Some(entry) = ring.pop() {
                any = true;
                // The task was handed out by `pop_ready` and is not complete
                // (a thread reports a task's issue before its completion).
                if entry & ISSUED != 0 {
                    let issued = self.orch.issued(self.base + (entry & !ISSUED));
                    debug_assert!(issued.is_ok(), "issue of task {entry:#x}");
                    continue;
                }
                let completed = self.orch.complete(self.base + entry);
                debug_assert!(completed.is_ok(), "completion of task {entry}");
                self.outstanding -= 1;
            }
        }
        any
    }

    fn kind_of(&self, task: u32) -> (u32, CoreKind) {
        let id = self.table.tasks()[task as usize].kernel_id.get();
        let kind = wsp_ffi::lookup(id).map_or(CoreKind::Vector, |k| k.kind);
        (id, kind)
    }

    /// Submits table tasks in order until one stalls.
    fn submit(&mut self, now: u64) -> Result<bool, RunError> {
        let mut submitted = false;
        let ops = self.table.stream_ops();
        loop {
            // Event records and waits come before the task they precede.
            while let Some(op) = ops.get(self.next_op) {
                if op.before_task.get() as usize > self.next {
                    break;
                }
                let (stream, event) = (op.stream.get(), op.event.get());
                let applied = if op.op.get() == STREAM_OP_RECORD {
                    self.orch.record_event(stream, event)
                } else {
                    self.orch.wait_event(stream, event)
                };
                if let Err(why) = applied {
                    return Err(RunError::StreamOpRefused {
                        op: self.next_op as u32,
                        why,
                    });
                }
                self.next_op += 1;
            }
            if self.next == self.table.tasks().len() {
                break;
            }
            let index = self.next as u32;
            let (kernel_id, kind) = self.kind_of(index);
            if self.eligible_count[kind as usize] == 0 {
                return Err(RunError::NoCoreForKind {
                    task: index,
                    kernel_id,
                    kind,
                });
            }
            let desc = &self.table.tasks()[self.next];
            let mut args = [TaskArg {
                tensor: 0,
                region: Region {
                    offset: [0; 4],
                    extent: [0; 4],
                },
                access: Access::READ,
            }; MAX_TENSOR_ARGS];
            let table_args = self.table.task_args(desc);
            for (arg, t) in args.iter_mut().zip(table_args) {
                *arg = TaskArg {
                    tensor: t.tensor.get(),
                    region: Region::of(t),
                    access: Access::from_bits_truncate(t.access.get()),
                };
            }
            let kernel = KernelRef {
                id: kernel_id,
                kind,
            };
            let args = &args[..table_args.len()];
            let stream = desc.stream.get();
            match self
                .orch
                .submit_on(now, stream, kernel, args, 0, &[], index as u64)
            {
                Ok(id) => {
                    debug_assert_eq!(id, self.base + index as u64);
                    self.next += 1;
                    submitted = true;
                }
                Err(SubmitError::Stall(_)) => break,
                Err(SubmitError::Deadlock(cause)) => {
                    return Err(RunError::Deadlock(self.orch.report(cause)))
                }
                // Validation refuses every task the orchestrator would;
                // reaching this means the two disagree: say so, do not run.
                Err(SubmitError::Invalid(why)) => {
                    return Err(RunError::Refused { task: index, why });
                }
            }
        }
        Ok(submitted)
    }

    /// Places ready tasks, oldest first, until none is left or a queue is full.
    fn dispatch(&mut self, now: u64) -> Result<bool, RunError> {
        let mut placed = false;
        for kind in [CoreKind::Cube, CoreKind::Vector] {
            let k = kind as usize;
            loop {
                let (task, target) = match self.held[k].take() {
                    Some(held) => held,
                    None => {
                        let Some(task) = self.orch.pop_ready(kind) else {
                            break;
                        };
                        (task, self.place(&task, kind)?)
                    }
                };
                let (owner, thread) = match target {
                    Target::Thread(t) => (&mut self.owners[t][k], Some(t)),
                    Target::Shared => (&mut self.shared[k], None),
                };
                let Some(owner) = owner.as_mut() else {
                    unreachable!("every queue is claimed in `new`")
                };
                if owner.len() >= self.depth || owner.push(task.tag).is_err() {
                    self.held[k] = Some((task, target));
                    if self.stalled_since.is_none() {
                        self.ready_queue.stalls += 1;
                        self.stalled_since = Some(now);
                    }
                    break;
                }
                let len = owner.len() as u64;
                self.ready_queue.high_water = self.ready_queue.high_water.max(len);
                if let Some(t) = thread {
                    let total = len + self.queues.ready[t][1 - k].len() as u64;
                    let stats = &mut self.per_thread[t];
                    stats.placed += 1;
                    stats.queue_high_water = stats.queue_high_water.max(total);
                }
                if let Some(since) = self.stalled_since.take() {
                    self.ready_queue.stall_ticks += now.saturating_sub(since);
                }
                self.outstanding += 1;
                placed = true;
            }
        }
        let mut load = Load {
            starved: self.queues.starved.load(Ordering::Relaxed),
            ..Load::default()
        };
        for (queued, ready) in load.queued.iter_mut().zip(&self.queues.ready) {
            *queued = ready.iter().map(|q| q.len()).sum();
        }
        self.policy.observe(&load);
        self.queues
            .stealing
            .store(self.policy.steals(), Ordering::Release);
        Ok(placed)
    }

    fn place(&mut self, task: &ReadyTask, kind: CoreKind) -> Result<Target, RunError> {
        let k = kind as usize;
        let index = task.tag as u32;
        let desc = &self.table.tasks()[index as usize];
        let info = TaskInfo {
            index,
            kernel_id: task.kernel.id,
            kind,
            key: self.key.of(self.table, desc, index),
        };
        let threads = self.eligible_count[k];
        let mut load = Load {
            starved: self.queues.starved.load(Ordering::Relaxed),
            ..Load::default()
        };
        for (queued, &t) in load.queued.iter_mut().zip(&self.eligible[k][..threads]) {
            *queued = self.queues.ready[t][k].len();
        }
        match self.policy.place(&info, threads, &load) {
            Placement::Thread(i) if i < threads => Ok(Target::Thread(self.eligible[k][i])),
            Placement::Thread(thread) => Err(RunError::Config(ConfigError::BadPlacement {
                policy: self.policy.name(),
                thread,
                threads,
            })),
            Placement::Shared => Ok(Target::Shared),
        }
    }

    /// Adds the dispatcher's figures to `stats`: the `READY_QUEUE_FULL`
    /// stalls, the orchestrator's other stalls, per-thread placements and
    /// the policy's decision.
    pub fn fill_stats(&self, stats: &mut RunStats) {
        stats.stalls = *self.orch.stats();
        stats.stalls.resources[StallReason::ReadyQueueFull as usize] = self.ready_queue;
        stats.policy = self.policy.decision();
        for (thread, figures) in stats.threads.iter_mut().zip(&self.per_thread) {
            thread.placed = figures.placed;
            thread.queue_high_water = figures.queue_high_water;
        }
    }
}
