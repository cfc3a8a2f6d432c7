//! Deadlock reports: when no progress is possible, say which resource, how
//! full, which tasks wait for what, which scopes are open, and what to change.

use core::fmt;

use wsp_ffi::CoreKind;

use super::stall::StallReason;
use super::TaskState;

/// Most blocked tasks a report lists (the oldest ones).
pub const REPORTED_TASKS: usize = 4;
/// Most producers listed per blocked task.
pub const REPORTED_PRODUCERS: usize = 3;
/// Deepest scope nesting (and so the most scopes a report lists).
pub const MAX_SCOPE_DEPTH: usize = 8;

/// Why nothing can make progress.
#[allow(missing_docs)] // Variant fields: see each variant's doc; their names say the rest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeadlockCause {
    /// The task window is full of tasks an open scope holds: none can retire
    /// before the scope ends, and the scope cannot end while submission waits.
    ScopeExceedsWindow {
        scope: &'static str,
        window: u64,
        held: u64,
    },
    /// The TensorMap or the heap ring is full of the entries and buffers of
    /// tasks an open scope holds: they are reclaimed only when those tasks
    /// retire, after the scope ends.
    ScopeExceedsPool {
        scope: &'static str,
        pool: StallReason,
        held: u64,
    },
    /// A task asks the heap ring for more than its whole arena.
    HeapRequestTooLarge { requested: u64, capacity: u64 },
    /// One task needs more units of a pool than exist (e.g. more arguments
    /// than TensorMap entries). Not raised for the DepList pool: a task's
    /// edges count only producers still running, which free them as they end.
    TaskExceedsPool {
        pool: StallReason,
        needed: u64,
        capacity: u64,
    },
    /// Tasks are ready for a core kind the platform does not have.
    NoCoreForKind { kind: CoreKind },
    /// Nothing runs, nothing is ready, and tasks still wait: a dependency
    /// that can never be met (e.g. on a task that can never run).
    Stuck,
}

/// One blocked task as reported.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockedTask {
    /// Its task id.
    pub id: u64,
    /// Its kernel.
    pub kernel_id: u32,
    /// Where it is in its life.
    pub state: TaskState,
    /// Unfinished producers it waits for (the first few).
    pub waits_on: [Option<u64>; REPORTED_PRODUCERS],
    /// Producers it waits for in all.
    pub producers: u32,
}

/// Use of one resource when the deadlock was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Occupancy {
    /// The resource.
    pub resource: StallReason,
    /// Units in use.
    pub used: u64,
    /// Units in all.
    pub capacity: u64,
}

/// The report that ends a run that cannot make progress.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeadlockReport {
    /// Why nothing can progress.
    pub cause: DeadlockCause,
    /// The resource submission was waiting for, if it was stalled.
    pub stalled_on: Option<StallReason>,
    /// Use of the task window and the pools.
    pub occupancy: [Occupancy; 4],
    /// Tasks submitted and not retired.
    pub in_flight: u64,
    /// The oldest blocked tasks.
    pub blocked: [Option<BlockedTask>; REPORTED_TASKS],
    /// The open scopes, outermost first: name and tasks held.
    pub scopes: [Option<(&'static str, u64)>; MAX_SCOPE_DEPTH],
}

impl DeadlockReport {
    /// One sentence on what to change.
    pub fn suggestion(&self) -> Suggestion<'_> {
        Suggestion(self)
    }
}

/// Display of [`DeadlockReport::suggestion`].
pub struct Suggestion<'a>(&'a DeadlockReport);

impl fmt::Display for Suggestion<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.cause {
            DeadlockCause::ScopeExceedsWindow { scope, window, held } => write!(
                f,
                "task_window {window} < {held}+ tasks held by scope '{scope}': raise the task window above the scope's \
                 task count, or split the scope"
            ),
            DeadlockCause::ScopeExceedsPool { scope, pool, held } => write!(
                f,
                "{pool} is full of the {held} tasks held by scope '{scope}': enlarge it \
                 (it needs room for every task of the scope), or split the scope"
            ),
            DeadlockCause::HeapRequestTooLarge { requested, capacity } => write!(
                f,
                "a task asks for {requested} heap bytes of {capacity}: enlarge the heap ring or tile the output smaller"
            ),
            DeadlockCause::TaskExceedsPool { pool, needed, capacity } => {
                write!(f, "one task needs {needed} of {pool}'s {capacity} units: enlarge that pool")
            }
            DeadlockCause::NoCoreForKind { kind } => {
                write!(f, "give the platform a {kind:?} core, or map the kernel to a kind it has")
            }
            DeadlockCause::Stuck => {
                write!(f, "check explicit dependencies: a waited-for task can never complete")
            }
        }
    }
}

impl fmt::Display for DeadlockCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            DeadlockCause::ScopeExceedsWindow { scope, held, .. } => {
                write!(
                    f,
                    "scope '{scope}' holds {held} tasks, the whole task window"
                )
            }
            DeadlockCause::ScopeExceedsPool { scope, pool, held } => {
                write!(
                    f,
                    "{pool} is full, and scope '{scope}' holds its {held} tasks"
                )
            }
            DeadlockCause::HeapRequestTooLarge {
                requested,
                capacity,
            } => {
                write!(
                    f,
                    "heap request of {requested} bytes exceeds the heap ring's {capacity}"
                )
            }
            DeadlockCause::TaskExceedsPool {
                pool,
                needed,
                capacity,
            } => {
                write!(
                    f,
                    "a task needs {needed} units of {pool}, which has {capacity}"
                )
            }
            DeadlockCause::NoCoreForKind { kind } => {
                write!(f, "tasks are ready for {kind:?} cores, and there are none")
            }
            DeadlockCause::Stuck => write!(f, "nothing runs or is ready, and tasks still wait"),
        }
    }
}

impl fmt::Display for DeadlockReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "deadlock: {}", self.cause)?;
        if let Some(reason) = self.stalled_on {
            writeln!(f, "  submission stalled on {reason}")?;
        }
        for o in &self.occupancy {
            writeln!(f, "  {:<20} {}/{}", o.resource.name(), o.used, o.capacity)?;
        }
        writeln!(f, "  tasks in flight: {}", self.in_flight)?;
        for t in self.blocked.iter().flatten() {
            write!(f, "  task {} (kernel {}) {:?}", t.id, t.kernel_id, t.state)?;
            if t.producers > 0 {
                write!(f, ", waits for {} producer(s):", t.producers)?;
                for p in t.waits_on.iter().flatten() {
                    write!(f, " {p}")?;
                }
            }
            writeln!(f)?;
        }
        for (name, tasks) in self.scopes.iter().flatten() {
            writeln!(f, "  open scope '{name}': {tasks} tasks")?;
        }
        write!(f, "  fix: {}", self.suggestion())
    }
}
