//! The dispatcher: submits a table's tasks, then the tasks its program
//! expands to, to the orchestrator in program order (which links them into
//! the release graph), writes a launch record for each expanded one, places
//! tasks that are ready at once, and those a thread released but did not
//! keep, in dispatch queues by the run's policy, and collects the threads'
//! completion reports so that the orchestrator retires the tasks.

use wsp_ffi::CoreKind;

use super::policy::{
    check_key, DispatchPolicy, Lacks, Load, Placement, Policy, TaskInfo, MAX_THREADS,
};
use super::record::Launch;
use super::run::{RunError, RunOptions, RunStats, TableOrchestrator, TasksetStats, MAX_RUN_TASKS};
use super::{
    Arena, ConfigError, Entry, Queues, SchedConfig, DISPATCH_QUEUE, RELEASED, RUNNING, SUBMIT_BATCH,
};
use crate::abi::launch::Symbols;
use crate::abi::program::{MAX_TASKSETS, OP_CALL, OP_CONSUME, OP_DISPATCH, OP_END, OP_LOOP};
use crate::abi::schedule::{DispatchKey, Schedule};
use crate::abi::{
    Region, Table, TensorDesc, ARENA_ALIGN, MAX_TENSOR_ARGS, STREAM_OP_RECORD, TASK_WINDOW,
};
use crate::expand::{tensor_view, Context, Expander, Next, TaskSpec, Wait, NO_ARG};
use crate::orch::scratch::{Bind, ScratchError, ScratchHeap};
use crate::orch::{
    Invalid, ReadyTask, ResourceStats, StallReason, SubmitError, TaskArg, TaskId, UsageError,
    WindowError,
};
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
    /// Taskset 0's policy: the run's.
    policy: &'a mut dyn DispatchPolicy,
    /// The policies of the program's other tasksets (`None` where the
    /// program defines none).
    policies: [Option<Policy>; MAX_TASKSETS],
    /// Each taskset's dispatch key; `None` if its policy places without one.
    key: [Option<DispatchKey>; MAX_TASKSETS],
    /// Tasks placed per taskset.
    placed_in: [u64; MAX_TASKSETS],
    /// Bit `t`: taskset `t` steals; bit `8 + t`: it keeps released tasks;
    /// as last told to the threads.
    published: Option<u16>,
    depth: usize,
    threads: usize,
    /// Per kind, the threads that own cores of it.
    eligible: [[usize; MAX_THREADS]; 2],
    eligible_count: [usize; 2],
    arena: Arena<'a>,
    symbols: Symbols,
    /// Task id of the run's task 0.
    base: TaskId,
    /// The run's number of the next task to submit; below the number of
    /// tasks in the tasks section, also its index there.
    next: u64,
    /// Tasks the run may submit ([`RunOptions::max_tasks`]).
    max_tasks: u64,
    /// Next stream op to apply (before table task `next`).
    next_op: usize,
    /// The program's machine, once the tasks section is submitted.
    expander: Expander,
    /// A task expanded and not yet submitted (the orchestrator stalled).
    pending: bool,
    /// The task to submit next (when `pending`), filled in place: a spec
    /// is a few hundred bytes, not moved per task.
    spec: TaskSpec,
    /// The arguments of `spec` the TensorMap tracks, rebuilt for each
    /// submission (a field, so that a submission does not fill a fresh
    /// array first).
    tracked: [TaskArg; MAX_TENSOR_ARGS],
    /// The program has ended.
    expanded: bool,
    /// What the program waited for at its last step, if it waited.
    waiting: Option<Wait>,
    /// The context of the program machine that issued each task of the
    /// window, by slot (for a process's sequential loops).
    contexts: [u8; TASK_WINDOW],
    /// The last expansion step ran out of budget.
    yielded: bool,
    /// A task finished since the last submission (which may have stalled).
    retired: bool,
    /// Some policy of the run observes the load
    /// ([`DispatchPolicy::observes`], asked once).
    observing: bool,
    /// [`Load::starved`] when the policies last observed the load.
    observed_starved: u64,
    /// Per kind, a ready task whose queue was full, and where it goes.
    held: [Option<(ReadyTask, Target)>; 2],
    ready_queue: ResourceStats,
    stalled_since: Option<u64>,
    per_thread: [DispatchStats; MAX_THREADS],
    /// Per thread and kind, the length of its dispatch queue after the
    /// dispatcher's last publish there: at least its length now, as only
    /// the dispatcher pushes and the others only take.
    pushed_len: [[u64; 2]; MAX_THREADS],
    /// The queues this round wrote tasks to and has not published
    /// ([`written_bit`]).
    written: u32,
    /// Told each task's number and loop indices as it is submitted, if set
    /// ([`Dispatcher::observe_submissions`]; a traced host run).
    on_submit: Option<OnSubmit<'a>>,
    /// The table's scratch tensors and the heap ring that holds them
    /// (inactive without scratch tensors).
    scratch: ScratchHeap,
    /// `HEAP_RING_FULL`: submissions that waited for heap ring room.
    heap_stats: ResourceStats,
    heap_stalled_since: Option<u64>,
}

/// What [`Dispatcher::observe_submissions`] calls: a task's number and
/// its loop indices.
pub type OnSubmit<'a> = &'a mut (dyn FnMut(u32, &[u32]) + Send);

impl<'a> Dispatcher<'a> {
    /// A dispatcher for running `table` on `arena` with `options`' symbols
    /// and task window, `orch` (which must hold no tasks), `policy` and
    /// `config`'s key for taskset 0 (the program's other tasksets bring
    /// their own), and threads whose core kinds
    /// are `thread_kinds[t] = [has cube cores, has vector cores]`. Start the
    /// other threads after this returns: it marks `queues` running.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        table: &'a Table<'a>,
        arena: Arena<'a>,
        options: &RunOptions,
        orch: &'a mut TableOrchestrator,
        queues: &'a Queues,
        policy: &'a mut dyn DispatchPolicy,
        config: &SchedConfig,
        thread_kinds: &[[bool; 2]],
    ) -> Result<Self, RunError> {
        // (An empty arena has no elements to misalign.)
        if !arena.is_empty() && !arena.is_aligned(ARENA_ALIGN) {
            return Err(RunError::ArenaMisaligned { align: ARENA_ALIGN });
        }
        if arena.len() < table.arena_size() {
            return Err(RunError::ArenaTooSmall {
                needed: table.arena_size(),
                available: arena.len(),
            });
        }
        let needed = table.program_info().symbols;
        if options.symbols.len() < needed {
            return Err(RunError::UnboundSymbols {
                needed,
                bound: options.symbols.len(),
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
        if !config.policy.uses_key() && config.key != DispatchKey::TaskIndex {
            return Err(RunError::Config(ConfigError::KeyIgnored {
                policy: config.policy,
                key: config.key,
            }));
        }
        options.check().map_err(RunError::Config)?;
        let max_tasks = options.max_tasks.unwrap_or(MAX_RUN_TASKS);
        let info = table.program_info();
        let window = options.window.unwrap_or(match info.window {
            0 => TASK_WINDOW,
            w => w as usize,
        });
        orch.set_window(window as u64).map_err(|e| match e {
            WindowError::OutOfRange { max, .. } => RunError::Config(ConfigError::Window {
                tasks: window,
                max: max as usize,
            }),
            // Checked above; kept apart should that check ever move.
            WindowError::InFlight { in_flight } => RunError::OrchestratorBusy { in_flight },
        })?;
        let mut policies = [None; MAX_TASKSETS];
        // A taskset whose policy places without a key has none (`None`);
        // validation refused one given a key anyway.
        let mut key = [config.policy.uses_key().then_some(config.key); MAX_TASKSETS];
        for set in 1..MAX_TASKSETS {
            if info.tasksets_defined & (1 << set) == 0 {
                continue;
            }
            let schedule = Schedule::decode(info.tasksets[set]).expect("validated");
            let built = schedule.policy.build().map_err(|error| {
                RunError::Config(ConfigError::TasksetPolicy {
                    taskset: set as u8,
                    error,
                })
            })?;
            policies[set] = Some(built);
            key[set] = schedule.policy.uses_key().then_some(schedule.key);
        }
        check_keys(table, &key)?;
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
        orch.use_graph_edges(super::GRAPH_EDGES as u64);
        queues.starved.store(0, Ordering::Relaxed);
        queues.state.store(RUNNING, Ordering::Release);
        let observing = policy.observes() || policies.iter().flatten().any(|p| p.observes());
        let mut dispatcher = Dispatcher {
            table,
            arena,
            symbols: options.symbols,
            base: orch.submitted(),
            orch,
            queues,
            owners,
            shared,
            policy,
            policies,
            key,
            placed_in: [0; MAX_TASKSETS],
            published: None,
            depth: config.queue_depth,
            threads,
            eligible,
            eligible_count,
            next: 0,
            max_tasks,
            next_op: 0,
            expander: Expander::new(table),
            waiting: None,
            contexts: [0; TASK_WINDOW],
            pending: false,
            spec: TaskSpec::empty(),
            tracked: [NO_ARG; MAX_TENSOR_ARGS],
            expanded: false,
            yielded: false,
            retired: false,
            observing,
            observed_starved: 0,
            held: [None; 2],
            ready_queue: ResourceStats {
                capacity: config.queue_depth as u64,
                ..ResourceStats::default()
            },
            stalled_since: None,
            per_thread: [DispatchStats::default(); MAX_THREADS],
            pushed_len: [[0; 2]; MAX_THREADS],
            written: 0,
            on_submit: None,
            scratch: ScratchHeap::of_table(table),
            heap_stats: ResourceStats {
                capacity: table.heap().1,
                ..ResourceStats::default()
            },
            heap_stalled_since: None,
        };
        dispatcher.publish_steals();
        Ok(dispatcher)
    }

    /// Tells the threads which tasksets they may steal from now, and which
    /// released tasks they keep (stores only what changed: this runs after
    /// every dispatch round).
    fn publish_steals(&mut self) {
        let (mut steals, mut keeps) = (
            self.policy.steals() as u8,
            self.policy.keeps_released() as u8,
        );
        for (set, policy) in self.policies.iter().enumerate() {
            if let Some(p) = policy {
                steals |= (p.steals() as u8) << set;
                keeps |= (p.keeps_released() as u8) << set;
            }
        }
        let mask = steals as u16 | (keeps as u16) << 8;
        if Some(mask) == self.published {
            return;
        }
        for (set, flag) in self.queues.steals.iter().enumerate() {
            flag.store(steals & (1 << set) != 0, Ordering::Release);
        }
        for (set, flag) in self.queues.keeps.iter().enumerate() {
            flag.store(keeps & (1 << set) != 0, Ordering::Release);
        }
        self.queues.stealing.store(steals != 0, Ordering::Release);
        self.published = Some(mask);
    }

    /// The queues it dispatches to.
    pub fn queues(&self) -> &'a Queues {
        self.queues
    }

    /// Every task of the table and its program has run and retired.
    pub fn finished(&self) -> bool {
        self.expanded && !self.pending && self.orch.is_drained()
    }

    /// One round: collect completions, submit, place ready tasks. Returns
    /// whether anything happened.
    pub fn step(&mut self, now: u64) -> Result<bool, RunError> {
        let mut progress = self.collect()?;
        progress |= self.submit(now)?;
        progress |= self.dispatch(now)?;
        Ok(progress)
    }

    /// Calls `on_submit` with each task's number in the run and the
    /// indices of the program loops around its call (outermost first; none
    /// for a task of the tasks section) as the task is submitted: a trace
    /// names tasks by them. Without it (the default) a submission checks
    /// one `None`.
    pub fn observe_submissions(&mut self, on_submit: OnSubmit<'a>) {
        self.on_submit = Some(on_submit);
    }

    /// What submissions or placements wait for now, if anything: room in
    /// an orchestrator resource, or in a full dispatch queue.
    pub fn stall(&self) -> Option<StallReason> {
        match self.stalled_since {
            Some(_) => Some(StallReason::ReadyQueueFull),
            None => self.orch.stats().current,
        }
    }

    /// Tasks submitted and not retired.
    pub fn in_flight(&self) -> u64 {
        self.orch.in_flight()
    }

    /// Ready tasks waiting in the dispatch queues (the threads' and the
    /// shared ones; read racily while threads take from them).
    pub fn queued(&self) -> u64 {
        let threads = self.queues.ready[..self.threads].iter().flatten();
        threads
            .chain(&self.queues.shared)
            .map(|q| q.len() as u64)
            .sum()
    }

    /// Called when a round of every thread did nothing: if no task is
    /// queued or running, nothing can ever complete, and the orchestrator
    /// proves whether that is the end or a deadlock.
    pub fn check_progress(&self) -> Result<(), RunError> {
        if self.held.iter().any(Option::is_some) {
            return Ok(());
        }
        // Processes parked on channels with nothing in flight: no
        // completion will come to wake them.
        if self.waiting.is_some() && self.orch.is_drained() && self.expander.parked_on_channels() {
            let report = self.expander.channel_report(self.table);
            return Err(RunError::ChannelDeadlock(report));
        }
        // Tasks of a kind without cores were refused at submission.
        self.orch
            .check_progress_linked(&self.queues.graph)
            .map_err(RunError::Deadlock)
    }

    /// When the program waits for a channel's latency to pass: the clock
    /// time at which to look again (the caller may sleep until then, or,
    /// in semantic time, move the clock there).
    pub fn wake_at(&self) -> Option<u64> {
        self.waiting.and(self.expander.wake_at())
    }

    /// Takes the threads' reports: completions to the orchestrator, which
    /// retires the tasks (their dependents were released already), and
    /// released tasks that a thread did not keep to be placed. A report the
    /// orchestrator refuses (a task not submitted, or reported finished
    /// twice) ends the run: the threads' view of the run no longer matches
    /// the orchestrator's.
    fn collect(&mut self) -> Result<bool, RunError> {
        let (mut any, mut finished_any) = (false, false);
        let queues = self.queues;
        for ring in &queues.done[..self.threads] {
            while let Some(report) = ring.pop() {
                any = true;
                let finished = report & RELEASED == 0;
                let entry = Entry(report & !RELEASED);
                let task = entry.task() as u64;
                // `base` counts the orchestrator's earlier tasks and `task`
                // is below 2^32: the sum cannot overflow.
                let id = self.base + task;
                let refused = |why| RunError::ReportRefused {
                    task,
                    finished,
                    why,
                };
                if finished {
                    // Retired below, once for the reports taken.
                    self.orch.finished_unretired(id).map_err(refused)?;
                    finished_any = true;
                } else if entry.slot() != self.slot_of(task) {
                    return Err(refused(UsageError::NotRunning { id }));
                } else {
                    // Into the orchestrator's ready list, to place.
                    self.orch.released(id).map_err(refused)?;
                }
            }
        }
        if finished_any {
            self.orch.retire_completed();
            self.retired = true;
        }
        Ok(any)
    }

    /// The release-graph slot of the run's task `task`.
    fn slot_of(&self, task: u64) -> usize {
        ((self.base + task) % TASK_WINDOW as u64) as usize
    }

    /// Writes the next task to submit, from the tasks section, then the
    /// program, to `self.spec`; `Ok(false)` when there is none now (the
    /// program waits or ended). Applies the event ops that come before it.
    fn next_task(&mut self, now: u64) -> Result<bool, RunError> {
        let tasks = self.table.tasks().len() as u64;
        let ops = self.table.stream_ops();
        // Event records and waits come before the task they precede.
        while let Some(op) = ops.get(self.next_op) {
            if op.before_task.get() as u64 > self.next {
                break;
            }
            let record = op.op.get() == STREAM_OP_RECORD;
            self.stream_op(record, op.stream.get(), op.event.get())
                .map_err(|why| RunError::StreamOpRefused {
                    op: self.next_op as u32,
                    why,
                })?;
            self.next_op += 1;
        }
        if self.next < tasks {
            self.spec.set_task(self.table, self.next as usize);
            return Ok(true);
        }
        loop {
            if self.expanded {
                return Ok(false);
            }
            let mut cx = Expansion {
                orch: &mut *self.orch,
                arena: &self.arena,
                symbols: &self.symbols,
                base: self.base,
                next: self.next,
                now,
                contexts: &self.contexts,
            };
            // A step runs many instructions (and may switch contexts): the
            // error names the one that failed, where the failing context
            // stopped, not the pc the step began at.
            let step = self
                .expander
                .step_into(self.table, &mut cx, &mut self.spec)
                .map_err(|why| RunError::Expand {
                    pc: self.expander.pc(),
                    why,
                })?;
            self.waiting = None;
            match step {
                Next::Task => return Ok(true),
                Next::Event {
                    record,
                    stream,
                    event,
                } => {
                    let pc = self.expander.pc() - 1;
                    self.stream_op(record, stream, event)
                        .map_err(|why| RunError::ProgramEventRefused { pc, why })?;
                }
                Next::Wait(wait) => {
                    self.waiting = Some(wait);
                    return Ok(false);
                }
                Next::Yield => {
                    self.yielded = true;
                    return Ok(false);
                }
                Next::Done => self.expanded = true,
            }
        }
    }

    fn stream_op(&mut self, record: bool, stream: u32, event: u32) -> Result<(), UsageError> {
        if record {
            self.orch.record_event(stream, event)
        } else {
            self.orch.wait_event(stream, event)
        }
    }

    /// Submits tasks in order until one stalls, none is left for now, or
    /// [`SUBMIT_BATCH`] went in (the round then places them: see there).
    fn submit(&mut self, now: u64) -> Result<bool, RunError> {
        // A stalled submission waits for room, which only a retirement
        // makes: no retry (a whole submission's checks) before one, and
        // none before a share of the window is free (see `retry_now`).
        if self.pending && (!core::mem::take(&mut self.retired) || !self.orch.retry_now()) {
            return Ok(false);
        }
        let mut submitted = false;
        for _ in 0..SUBMIT_BATCH {
            if !core::mem::take(&mut self.pending) && !self.next_task(now)? {
                // A program that ran out of its step budget has more to do
                // now: that is progress. (One that waits is not: it needs a
                // completion first.)
                submitted |= core::mem::take(&mut self.yielded);
                break;
            }
            // A full window is a stall only when a task waits for room: the
            // task is built first (once: it stays pending until it goes in,
            // and the rounds before a retirement skip it, above), so a run
            // whose last task fills the window reports no stall after it.
            // (One call of `next_task`, inlined: a second call site made it
            // a call, about 40 instructions a task.)
            match self.orch.window_full(now) {
                Ok(false) => {}
                Ok(true) => {
                    self.pending = true;
                    break;
                }
                Err(SubmitError::Deadlock(cause)) => {
                    let report = self.orch.report_linked(cause, &self.queues.graph);
                    return Err(RunError::Deadlock(report));
                }
                Err(_) => unreachable!("a full window stalls or deadlocks"),
            }
            // A task that uses scratch tensors needs their storage first.
            if self.scratch.is_active() && !self.bind_scratch(now)? {
                self.pending = true;
                break;
            }
            let spec = &self.spec;
            let index = self.next;
            // Task numbers are u32 on the cores' side (queue entries, launch
            // records, reports): a run ends with an error past 2^32 tasks
            // (or the run's lower limit) rather than wrapping, before any
            // figure names a task number.
            if index >= self.max_tasks {
                return Err(RunError::TooManyTasks {
                    max: self.max_tasks,
                });
            }
            let kind = spec.kernel.kind;
            if self.eligible_count[kind as usize] == 0 {
                return Err(RunError::NoCoreForKind {
                    task: index as u32,
                    kernel_id: spec.kernel.id,
                    kind,
                });
            }
            let set = spec.taskset;
            // Tasks of the tasks section were all checked before the run;
            // a program call is checked here too, as a jump past a
            // DISPATCH can put it in another taskset than its text's.
            let key_value = match (self.key[set as usize], spec.pc) {
                (Some(key), None) => key.value(spec, index),
                (Some(key), Some(pc)) => key
                    .of(spec, index, self.table)
                    .map_err(|lacks| key_error(key, set, None, Some(pc), lacks))?,
                (None, _) => 0,
            };
            let entry = Entry::new(index as u32, set, kind, self.slot_of(index));
            // What threads and the policy read of the task, written before
            // the submission, after which a thread may release it at any
            // time. Only when the slot's previous task has retired (no one
            // reads its words any more): otherwise the window is full and
            // the submission stalls (or reports a scope deadlock).
            let room = self.orch.in_flight() < TASK_WINDOW as u64;
            if room {
                let slot = entry.slot();
                self.contexts[slot] = spec.context;
                // Each task's dispatch key, for the dispatcher's own later
                // placing (of every task, also those of the tasks section),
                // in its release-graph slot's spare word.
                self.queues.graph.set_key(slot, key_value);
                // A task of the tasks section launches from the table
                // (shared, read-only); an expanded one from its record.
                // With scratch tensors, every task launches from its
                // record: their views are rebased on the heap ring.
                if spec.pc.is_some() || self.scratch.is_active() {
                    let mut args = spec.kernel_args(self.table, 0);
                    if self.scratch.is_active() {
                        self.rebase(&mut args);
                    }
                    let spec = &self.spec;
                    let mut tensors = [0; MAX_TENSOR_ARGS];
                    for (t, arg) in tensors.iter_mut().zip(spec.args()) {
                        *t = arg.tensor;
                    }
                    let launch = Launch {
                        kernel_id: spec.kernel.id,
                        stream: spec.stream,
                        args,
                        tensors,
                    };
                    self.queues.records.write(index, &launch);
                }
            }
            let spec = &self.spec;
            let graph = &self.queues.graph;
            // The TensorMap tracks the arguments on tensors some task
            // writes; one that none writes (a weight, an input) can
            // neither wait for a writer nor hold one back.
            let mut count = 0;
            for arg in spec.args() {
                if !self.table.is_read_only(arg.tensor) {
                    self.tracked[count] = *arg;
                    count += 1;
                }
            }
            match self.orch.submit_linked(
                graph,
                now,
                spec.stream,
                spec.kernel,
                &self.tracked[..count],
                entry.0,
                entry.0,
            ) {
                // Ready at once, it goes to the orchestrator's ready list
                // to be placed; else the graph releases it.
                Ok((id, ready)) => {
                    if ready {
                        self.orch.push_ready(id);
                    }
                    // Only this dispatcher submits to `orch` (it holds it
                    // mutably for the run), so ids follow the run's numbers.
                    debug_assert_eq!(id, self.base + index);
                    debug_assert!(room, "the window is at most TASK_WINDOW");
                    if let Some(on_submit) = self.on_submit.as_mut() {
                        on_submit(index as u32, &spec.loops);
                    }
                    self.next += 1;
                    submitted = true;
                }
                Err(SubmitError::Stall(_)) => {
                    self.pending = true;
                    break;
                }
                Err(SubmitError::Deadlock(cause)) => {
                    let report = self.orch.report_linked(cause, &self.queues.graph);
                    return Err(RunError::Deadlock(report));
                }
                // Validation refuses every table task the orchestrator
                // would, and expansion checks each program task's regions;
                // what is left (e.g. a program task whose output overlaps
                // its input) is refused here, before anything runs. The
                // orchestrator numbers only the arguments it was given (the
                // tracked ones); the report names them by their positions
                // in the task.
                Err(SubmitError::Invalid(why)) => {
                    let why = match why {
                        Invalid::ArgsOverlap { index: a, other: b } => {
                            let tracked = (spec.args().iter().enumerate())
                                .filter(|(_, arg)| !self.table.is_read_only(arg.tensor))
                                .map(|(i, _)| i);
                            let at = |n: usize| tracked.clone().nth(n).unwrap_or(n);
                            Invalid::ArgsOverlap {
                                index: at(a),
                                other: at(b),
                            }
                        }
                        why => why,
                    };
                    return Err(RunError::Refused {
                        task: index as u32,
                        why,
                    });
                }
            }
        }
        Ok(submitted)
    }

    /// Gives the scratch tensors of the task in `self.spec` (the run's task
    /// `self.next`) storage on the heap ring, after applying the program's
    /// `FREE`s so far. `Ok(false)`: the ring is full and a retirement may
    /// make room (a `HEAP_RING_FULL` stall); with no task in flight none
    /// can, and the run ends with a report.
    #[cold]
    fn bind_scratch(&mut self, now: u64) -> Result<bool, RunError> {
        while let Some(t) = self.expander.take_free() {
            self.scratch.free(t, self.next);
        }
        let in_flight = self.orch.in_flight();
        let retired = self.next - in_flight;
        let task = self.next as u32;
        let name = |t: u32| self.table.tensors()[t as usize].name;
        match self.scratch.bind(self.spec.args(), self.next, retired) {
            Ok(()) => {
                if let Some(since) = self.heap_stalled_since.take() {
                    self.heap_stats.stall_ticks += now.saturating_sub(since);
                }
                self.heap_stats.high_water = self.scratch.high_water();
                Ok(true)
            }
            Err(Bind::Full { tensor, requested }) if in_flight == 0 => {
                Err(RunError::Scratch(ScratchError::DoesNotFit {
                    task,
                    tensor,
                    name: name(tensor),
                    requested,
                    used: self.scratch.used(),
                    capacity: self.scratch.capacity(),
                    live: self.scratch.live(),
                    oldest: self.scratch.oldest(),
                }))
            }
            Err(Bind::Full { .. }) => {
                if self.heap_stalled_since.is_none() {
                    self.heap_stalled_since = Some(now);
                    self.heap_stats.stalls += 1;
                }
                Ok(false)
            }
            Err(Bind::ReadBeforeWrite { tensor }) => {
                Err(RunError::Scratch(ScratchError::ReadBeforeWrite {
                    task,
                    tensor,
                    name: name(tensor),
                }))
            }
        }
    }

    /// Points the views of the scratch tensors in `args` (built from the
    /// table for the task in `self.spec`) at their heap ring storage.
    #[cold]
    fn rebase(&self, args: &mut wsp_ffi::WspKernelArgs) {
        for (view, arg) in args.tensors.iter_mut().zip(self.spec.args()) {
            if let Some(base) = self.scratch.base_of(arg.tensor) {
                let mut desc = self.table.tensors()[arg.tensor as usize];
                desc.arena_offset.set(base);
                *view = tensor_view(&desc, &arg.region, 0);
            }
        }
    }

    /// Places ready tasks, oldest first, until none is left or a queue is full.
    fn dispatch(&mut self, now: u64) -> Result<bool, RunError> {
        let mut placed = false;
        // Where the threads release most tasks (chains, fan-ins), most
        // rounds find nothing to place here: one test, not both kinds'
        // loops (about 50 instructions a round).
        let none = self.held[0].is_none() && self.held[1].is_none() && !self.orch.has_ready();
        let kinds: &[CoreKind] = if none {
            &[]
        } else {
            &[CoreKind::Cube, CoreKind::Vector]
        };
        for &kind in kinds {
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
                let entry = Entry(task.tag);
                let set = entry.taskset();
                // The bound first: the exact length reads the line the
                // thread writes as it takes tasks.
                let full = owner.len_bound() >= self.depth && owner.len() >= self.depth;
                // Shown to the threads at the end of the round (below).
                if full || owner.write(task.tag).is_err() {
                    self.held[k] = Some((task, target));
                    if self.stalled_since.is_none() {
                        self.ready_queue.stalls += 1;
                        self.stalled_since = Some(now);
                    }
                    break;
                }
                self.written |= 1 << written_bit(thread, k);
                if let Some(t) = thread {
                    self.per_thread[t].placed += 1;
                }
                if let Some(since) = self.stalled_since.take() {
                    self.ready_queue.stall_ticks += now.saturating_sub(since);
                }
                self.placed_in[set] += 1;
                placed = true;
            }
        }
        if placed {
            self.publish();
        }
        // Policies that never change their mind need not look.
        if !self.observing {
            return Ok(placed);
        }
        // Policies look again when the load changed: tasks were placed or
        // threads starved. (Reading every queue's length reads lines the
        // other threads write: not on every idle round.)
        let starved = self.queues.starved.load(Ordering::Relaxed);
        if !placed && starved == self.observed_starved {
            return Ok(false);
        }
        self.observed_starved = starved;
        let mut load = Load {
            starved,
            ..Load::default()
        };
        for (queued, ready) in load.queued.iter_mut().zip(&self.queues.ready) {
            *queued = ready.iter().map(|q| q.len()).sum();
        }
        self.policy.observe(&load);
        for policy in self.policies.iter_mut().flatten() {
            policy.observe(&load);
        }
        self.publish_steals();
        Ok(placed)
    }

    /// Shows the threads the tasks this round wrote to their queues: one
    /// store of each queue's bottom for all of them, so that a thread
    /// reads that line once for the round. The queues' high-water marks
    /// are taken here: a queue grows only when it is published, so its
    /// length just after is its largest since the last publish (less what
    /// a thread took in between).
    fn publish(&mut self) {
        let mut written = core::mem::take(&mut self.written);
        while written != 0 {
            let bit = written.trailing_zeros() as usize;
            written &= written - 1;
            let (t, k) = (bit / 2, bit % 2);
            let owner = match t {
                MAX_THREADS => &mut self.shared[k],
                t => &mut self.owners[t][k],
            };
            let Some(owner) = owner.as_mut() else {
                continue;
            };
            owner.publish();
            // Reads the line the taking thread writes: once a round.
            let len = owner.len() as u64;
            self.ready_queue.high_water = self.ready_queue.high_water.max(len);
            if t < MAX_THREADS {
                self.pushed_len[t][k] = len;
                // The other kind's queue holds at most what it held at its
                // last publish: only when that could make a new high is its
                // length read.
                let stats = &mut self.per_thread[t];
                if len + self.pushed_len[t][1 - k] > stats.queue_high_water {
                    let other = self.queues.ready[t][1 - k].len() as u64;
                    stats.queue_high_water = stats.queue_high_water.max(len + other);
                }
            }
        }
    }

    fn place(&mut self, task: &ReadyTask, kind: CoreKind) -> Result<Target, RunError> {
        let k = kind as usize;
        let entry = Entry(task.tag);
        let info = TaskInfo {
            index: entry.task(),
            kernel_id: task.kernel.id,
            kind,
            key: self.queues.graph.key(entry.slot()),
        };
        let policy: &mut dyn DispatchPolicy = match &mut self.policies[entry.taskset()] {
            Some(p) => p,
            None => &mut *self.policy,
        };
        let threads = self.eligible_count[k];
        let mut load = Load {
            starved: self.queues.starved.load(Ordering::Relaxed),
            ..Load::default()
        };
        if policy.reads_queued() {
            for (queued, &t) in load.queued.iter_mut().zip(&self.eligible[k][..threads]) {
                *queued = self.queues.ready[t][k].len();
            }
        }
        match policy.place(&info, threads, &load) {
            Placement::Thread(i) if i < threads => Ok(Target::Thread(self.eligible[k][i])),
            Placement::Thread(thread) => Err(RunError::Config(ConfigError::BadPlacement {
                policy: policy.name(),
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
        stats.stalls = self.orch.stats();
        stats.stalls.resources[StallReason::ReadyQueueFull as usize] = self.ready_queue;
        if self.scratch.is_active() {
            // Table runs use the heap ring for scratch tensors only.
            stats.stalls.resources[StallReason::HeapRingFull as usize] = self.heap_stats;
            stats.scratch_bytes = self.scratch.taken_bytes();
        }
        let [full, empty] = self.expander.channel_stats();
        stats.stalls.resources[StallReason::ChannelFull as usize] = full;
        stats.stalls.resources[StallReason::ChannelEmpty as usize] = empty;
        stats.policy = self.policy.decision();
        stats.window = self.orch.window();
        for (set, out) in stats.tasksets.iter_mut().enumerate() {
            let decision = match (set, &self.policies[set]) {
                (0, _) => self.policy.decision(),
                (_, Some(p)) => p.decision(),
                (_, None) => continue,
            };
            *out = Some(TasksetStats {
                decision,
                key: self.key[set],
                placed: self.placed_in[set],
            });
        }
        for (thread, figures) in stats.threads.iter_mut().zip(&self.per_thread) {
            thread.placed = figures.placed;
            thread.queue_high_water = figures.queue_high_water;
        }
    }
}

fn key_error(
    key: DispatchKey,
    taskset: u8,
    task: Option<u32>,
    pc: Option<u32>,
    lacks: Lacks,
) -> RunError {
    RunError::KeyNotInTask {
        key,
        taskset,
        task,
        pc,
        has: lacks.has,
        what: lacks.what,
    }
}

/// Checks before anything runs that every task a key-based taskset places
/// has what its key names: a key naming a scalar, argument, dimension or
/// loop a task lacks would otherwise give that task key 0 without a word
/// (and a mistyped `--key scalar:9` every task). Taskset 0 holds the tasks
/// section; a program's calls belong to the taskset of the last `DISPATCH`
/// before them in program text. (A jump may make a call expand under
/// another taskset; the dispatcher checks each task again as it submits it.)
fn check_keys(
    table: &Table<'_>,
    keys: &[Option<DispatchKey>; MAX_TASKSETS],
) -> Result<(), RunError> {
    let rank =
        |tensor: u32| (table.tensors().get(tensor as usize)).map_or(0, |t| t.rank.get() as usize);
    // A key of every task's (its number, its stream) needs no walk over
    // the tasks: on a million-task table that walk took about 5 % of the
    // run's time on the dispatcher's thread (BENCHMARKS.md). Nor does a
    // loop key, which no task of the tasks section has.
    if let (Some(key @ DispatchKey::Loop(_)), false) = (keys[0], table.tasks().is_empty()) {
        check_key(key, 0, 0, |_| 0, None)
            .map_err(|lacks| key_error(key, 0, Some(0), None, lacks))?;
    }
    let of_fields = |key| matches!(key, DispatchKey::Scalar(_) | DispatchKey::Tile { .. });
    if let Some(key) = keys[0].filter(|&key| of_fields(key)) {
        for (index, desc) in table.tasks().iter().enumerate() {
            let args = table.task_args(desc);
            let scalars = desc.num_scalars.get() as usize;
            let rank_of = |a: usize| rank(args[a].tensor.get());
            check_key(key, scalars, args.len(), rank_of, None)
                .map_err(|lacks| key_error(key, 0, Some(index as u32), None, lacks))?;
        }
    }
    let program = table.program();
    let (mut depth, mut set) = (0, 0);
    for (pc, ins) in program.iter().enumerate() {
        match ins.op {
            OP_LOOP | OP_CONSUME => depth += 1,
            OP_END => depth -= 1,
            OP_DISPATCH => set = ins.imm.get() as usize,
            OP_CALL => {
                let Some(key) = keys[set] else { continue };
                let Some(kernel) = wsp_ffi::lookup(ins.imm.get()) else {
                    unreachable!("validation refuses calls of unknown kernels")
                };
                let (args, scalars) = (kernel.num_tensors as usize, kernel.num_scalars as usize);
                let rank_of = |a: usize| rank(program[pc + 1 + a].imm.get());
                check_key(key, scalars, args, rank_of, Some(depth))
                    .map_err(|lacks| key_error(key, set as u8, None, Some(pc as u32), lacks))?;
            }
            _ => {}
        }
    }
    Ok(())
}

/// What the program's expansion sees of the run.
struct Expansion<'x, 'a> {
    orch: &'x mut TableOrchestrator,
    arena: &'x Arena<'a>,
    symbols: &'x Symbols,
    base: TaskId,
    next: u64,
    now: u64,
    contexts: &'x [u8; TASK_WINDOW],
}

impl Context for Expansion<'_, '_> {
    fn task_done(&self, task: u64) -> bool {
        task < self.next && !self.orch.is_live(self.base + task)
    }

    fn now(&self) -> u64 {
        self.now
    }

    fn symbol(&self, index: usize) -> Option<i64> {
        self.symbols.get(index)
    }

    fn next_task(&self) -> u64 {
        self.next
    }

    fn pending_writer(&mut self, tensor: u32, region: &Region) -> Option<TaskId> {
        self.orch.pending_writer(tensor, region)
    }

    fn completed_since(&self, first: u64) -> bool {
        self.orch.completed_since(self.base + first)
    }

    fn completed_since_in(&self, first: u64, context: u8) -> bool {
        let contexts = self.contexts;
        self.orch.completed_since_where(self.base + first, |id| {
            contexts[(id % TASK_WINDOW as u64) as usize] == context
        })
    }

    fn read_i32(&mut self, tensor: &TensorDesc, element: u64) -> i32 {
        let offset = tensor.arena_offset.get() + element * 4;
        // SAFETY: validation put the tensor inside the arena, and the
        // expander checked the element index against its shape; the
        // expander asked `pending_writer` first, which found no task that
        // writes the element running or waiting, and later writers are not
        // submitted yet, so nothing writes these bytes during the read.
        unsafe { self.arena.read_i32(offset) }
    }
}

/// The bit of [`Dispatcher::written`] for the dispatch queue of `thread`
/// (the shared one for `None`) and kind `k`.
fn written_bit(thread: Option<usize>, k: usize) -> u32 {
    (thread.unwrap_or(MAX_THREADS) * 2 + k) as u32
}
const _: () = assert!((MAX_THREADS + 1) * 2 <= 32, "the written bits fit a u32");

#[cfg(test)]
#[cfg(not(loom))]
mod tests {
    use std::boxed::Box;
    use std::vec::Vec;

    use zerocopy::{FromZeros, IntoBytes};

    use super::*;
    use crate::abi::{table_checksum, TableHeader, ABI_VERSION, HEADER_SIZE, MAGIC};
    use crate::sched::policy::RoundRobin;

    /// A table with no tensors, kernels or tasks: header only.
    pub(super) fn empty_table() -> Vec<u8> {
        let mut header = TableHeader::new_zeroed();
        header.magic = MAGIC;
        header.abi_version.set(ABI_VERSION);
        header.header_size.set(HEADER_SIZE as u32);
        header.total_len.set(HEADER_SIZE as u32);
        let mut bytes = header.as_bytes().to_vec();
        let crc = table_checksum(&bytes);
        bytes[crate::abi::CHECKSUM_FIELD].copy_from_slice(&crc.to_le_bytes());
        bytes
    }

    /// Makes the dispatcher of an empty table on one thread with
    /// `options` and hands it, with its queues, to `f`: on a thread with
    /// room for the queues and the orchestrator, which a debug build
    /// builds on the stack before it boxes them.
    fn on_empty_table<R: Send + 'static>(
        options: RunOptions,
        f: impl for<'a> FnOnce(Result<Dispatcher<'a>, RunError>, &'a Queues) -> R + Send + 'static,
    ) -> R {
        std::thread::Builder::new()
            .stack_size(64 << 20)
            .spawn(move || {
                let bytes = empty_table();
                let table = Table::parse(&bytes).unwrap();
                let mut arena = [0u8; 0];
                let queues = Box::new(Queues::new());
                let mut orch = Box::new(TableOrchestrator::for_tables());
                let mut policy = RoundRobin::default();
                let dispatcher = Dispatcher::new(
                    &table,
                    Arena::new(&mut arena),
                    &options,
                    &mut orch,
                    &queues,
                    &mut policy,
                    &SchedConfig {
                        threads: 1,
                        ..SchedConfig::default()
                    },
                    &[[true, true]],
                );
                f(dispatcher, &queues)
            })
            .unwrap()
            .join()
            .unwrap()
    }

    /// Runs the dispatcher of an empty table on one thread after `report`
    /// was put in the thread's completion ring.
    fn step_after(report: u64) -> Result<bool, RunError> {
        on_empty_table(RunOptions::default(), move |dispatcher, queues| {
            let mut dispatcher = dispatcher.unwrap();
            assert!(queues.done[0].push(report));
            dispatcher.step(0)
        })
    }

    /// What [`Dispatcher::new`] says to `options` for an empty table on
    /// one thread.
    fn new_with(options: RunOptions) -> Result<(), RunError> {
        on_empty_table(options, |dispatcher, _| dispatcher.map(drop))
    }

    /// A timeout of 0 ms is refused naming the setting: it used to be
    /// taken, and the run then blamed a healthy core (`core 0 did not
    /// acknowledge task 0 ... within 0 ms`).
    #[test]
    fn a_timeout_of_0_ms_is_refused_naming_the_setting() {
        assert_eq!(new_with(RunOptions::default()), Ok(()));
        let cases = [
            (
                RunOptions {
                    kernel_timeout_ms: 0,
                    ..RunOptions::default()
                },
                ConfigError::KernelTimeout { ms: 0 },
                "a kernel timeout (kernel_timeout_ms) of 0 ms; at least 1 ms is needed",
            ),
            (
                RunOptions {
                    ack_timeout_ms: 0,
                    ..RunOptions::default()
                },
                ConfigError::AckTimeout { ms: 0 },
                "an acknowledgement timeout (ack_timeout_ms) of 0 ms; at least 1 ms is needed",
            ),
        ];
        for (options, error, says) in cases {
            assert_eq!(new_with(options), Err(RunError::Config(error)));
            assert_eq!(options.check(), Err(error));
            assert!(error.to_string().contains(says), "{error}");
        }
        let one = RunOptions {
            kernel_timeout_ms: 1,
            ack_timeout_ms: 1,
            ..RunOptions::default()
        };
        assert_eq!(new_with(one), Ok(()));
    }

    /// Queues that a run left something in are not recycled, and are
    /// left as they are; emptied, they are, whatever state the run left.
    #[test]
    fn queues_with_an_entry_left_are_not_recycled() {
        std::thread::Builder::new()
            .stack_size(64 << 20)
            .spawn(|| {
                let mut queues = Box::new(Queues::new());
                assert!(queues.done[1].push(7));
                queues.shared[0].claim_owner().unwrap().push(9).unwrap();
                queues.abort();
                assert!(!queues.recycle(), "a report and a queued task left");
                assert_eq!(queues.done[1].pop(), Some(7));
                assert!(!queues.recycle(), "a queued task left");
                assert_eq!(queues.state(), super::super::ABORTED, "unchanged");
                assert_eq!(queues.shared[0].steal(), crate::steal_deque::Steal::Task(9));
                assert!(queues.recycle());
                assert_eq!(queues.state(), RUNNING);
            })
            .unwrap()
            .join()
            .unwrap();
    }

    /// Reset queues are empty and running whatever a run left, and the
    /// ends a failed run left claimed can be claimed again.
    #[test]
    fn queues_are_reset_whatever_a_run_left() {
        std::thread::Builder::new()
            .stack_size(64 << 20)
            .spawn(|| {
                let mut queues = Box::new(Queues::new());
                assert!(queues.done[1].push(7));
                let mut shared = queues.shared[0].claim_owner().unwrap();
                shared.push(9).unwrap();
                // Left claimed, as by a scheduler lost with its thread.
                core::mem::forget(shared);
                queues.ready[0][1].claim_owner().unwrap().push(4).unwrap();
                queues.stealing.store(true, Ordering::Relaxed);
                queues.starved.store(3, Ordering::Relaxed);
                queues.abort();
                queues.reset();
                assert_eq!(queues.state(), RUNNING);
                assert_eq!(queues.done[1].pop(), None);
                assert_eq!(queues.ready[0][1].steal(), crate::steal_deque::Steal::Empty);
                assert!(!queues.stealing.load(Ordering::Relaxed));
                assert_eq!(queues.starved.load(Ordering::Relaxed), 0);
                let mut shared = queues.shared[0].claim_owner().expect("free again");
                assert_eq!(shared.pop(), None);
                drop(shared);
                assert!(queues.recycle(), "empty now");
            })
            .unwrap()
            .join()
            .unwrap();
    }

    #[test]
    fn a_report_of_a_task_not_handed_out_ends_the_run() {
        let not_running = UsageError::NotRunning { id: 3 };
        assert_eq!(
            step_after(3),
            Err(RunError::ReportRefused {
                task: 3,
                finished: true,
                why: not_running,
            })
        );
        // A release of a task never submitted.
        let err = step_after(3 | RELEASED).unwrap_err();
        assert_eq!(
            err,
            RunError::ReportRefused {
                task: 3,
                finished: false,
                why: not_running,
            }
        );
        let text = std::format!("{err}");
        assert!(
            text.contains("task 3 was released") && text.contains("not running"),
            "{text}"
        );
    }
}

#[cfg(test)]
#[cfg(not(loom))]
mod ring_tests {
    use std::boxed::Box;

    use wsp_ffi::{CoreKind, WspKernelArgs};

    use super::super::{Entry, Scheduler, DONE_RING};
    use super::tests::empty_table;
    use super::*;
    use crate::platform::{Clock, Completion, Platform};

    /// One vector core that never finishes anything.
    struct Idle;

    impl Clock for Idle {
        fn now(&self) -> u64 {
            0
        }
        fn ticks_per_second(&self) -> u64 {
            1
        }
    }

    impl Platform for Idle {
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
            None
        }
    }

    /// Runs `check` on a thread with room for the queues (built on the
    /// stack before they are boxed in a debug build), with scheduler
    /// thread `id` of `threads` on one idle vector core, over an empty
    /// table, and the queues it shares.
    fn with_scheduler(
        id: usize,
        threads: usize,
        check: impl FnOnce(&mut Scheduler<'_, Idle>, &Queues) + Send + 'static,
    ) {
        std::thread::Builder::new()
            .stack_size(64 << 20)
            .spawn(move || {
                let bytes = empty_table();
                let table = Table::parse(&bytes).unwrap();
                let mut arena = [0u8; 0];
                let queues = Box::new(Queues::new());
                let options = RunOptions::default();
                let mut s = Scheduler::new(
                    id,
                    threads,
                    Idle,
                    &[0],
                    &table,
                    Arena::new(&mut arena),
                    &queues,
                    &options,
                )
                .unwrap();
                check(&mut s, &queues);
            })
            .unwrap()
            .join()
            .unwrap();
    }

    /// A task a thread releases while it has an idle core for it waits in
    /// the thread's own slot, out of thieves' reach, and is the next it
    /// takes; a second one in the same round goes to its stealable queue.
    #[test]
    fn a_released_task_with_an_idle_core_is_not_stealable() {
        // Thread 1 of 2 (thread 0 dispatches and keeps nothing).
        with_scheduler(1, 2, |s, queues| {
            queues.keeps[0].store(true, Ordering::Relaxed);
            let (a, b) = (
                Entry::new(7, 0, CoreKind::Vector, 7),
                Entry::new(8, 0, CoreKind::Vector, 8),
            );
            let own = &queues.local[1][CoreKind::Vector as usize];
            s.keep_or_hand_on(a.0);
            assert!(own.is_empty(), "a thief finds nothing to take");
            s.keep_or_hand_on(b.0);
            assert_eq!(own.len(), 1);
            assert_eq!(s.take(CoreKind::Vector, false), Some(a));
            assert_eq!(s.take(CoreKind::Vector, false), Some(b));
            assert_eq!(s.take(CoreKind::Vector, false), None);
            assert!(queues.done[1].is_empty(), "nothing went to the dispatcher");
        });
    }

    /// A release that finds the completion ring full ends the run with an
    /// error naming it, rather than dropping the task.
    #[test]
    fn a_report_that_finds_the_ring_full_ends_the_run() {
        with_scheduler(0, 1, |s, queues| {
            for i in 0..DONE_RING as u64 {
                assert!(queues.done[0].push(i));
            }
            assert_eq!(s.check_ring(), Ok(()));
            // A task of a taskset that does not keep released tasks: it
            // goes to the dispatcher, through the full ring.
            s.keep_or_hand_on(Entry::new(7, 0, CoreKind::Vector, 7).0);
            let err = s.check_ring().unwrap_err();
            assert_eq!(err, RunError::CompletionRingFull { thread: 0 });
            assert!(std::format!("{err}").contains("completion ring was full"));
        });
    }
}
