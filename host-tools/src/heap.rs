//! Building the runtime's large statics (the dispatch [`Queues`] and the
//! [`TableOrchestrator`], hundreds of KiB each at the default task window)
//! on the heap for a host run.
//!
//! A `Box::new(Queues::new())` builds the value where the optimizer
//! likes: in release builds straight into the allocation, in debug builds
//! on the calling thread's stack first, which overflows the 2 MiB stacks
//! that test threads get. So debug builds build it on a short-lived thread
//! with a stack sized for the value.
//!
//! A run takes both from [`run_state`]: the pairs earlier runs left are
//! kept, reset in place ([`Queues::reset`], [`TableOrchestrator::reset`])
//! instead of built again, since building them was most of a small run's
//! time (about 1.5 MB written, twice in release builds and on a new
//! thread in debug builds).

use std::sync::{Mutex, PoisonError};

use device_runtime::sched::{Queues, TableOrchestrator};

/// `make()` in a box, without a stack the size of the value in debug builds.
/// Out of line: in release builds the value may still pass through this
/// function's stack frame, and a frame that large is probed page by page
/// on entry (on a new thread, a fault per page), so callers that only
/// sometimes build must not have it inlined into theirs.
#[inline(never)]
pub fn boxed<T: Send + 'static>(make: fn() -> T) -> Box<T> {
    if cfg!(debug_assertions) {
        let stack = 4 * core::mem::size_of::<T>() + (1 << 20);
        std::thread::Builder::new()
            .name("wsp-build".into())
            .stack_size(stack)
            .spawn(move || Box::new(make()))
            .and_then(|t| t.join().map_err(|_| std::io::Error::other("panicked")))
            .unwrap_or_else(|e| panic!("building a runtime structure on the heap: {e}"))
    } else {
        Box::new(make())
    }
}

/// Empty dispatch queues on the heap.
pub fn queues() -> Box<Queues> {
    boxed(Queues::new)
}

/// A drained table orchestrator on the heap.
pub fn orchestrator() -> Box<TableOrchestrator> {
    boxed(TableOrchestrator::for_tables)
}

/// Spare pairs kept for later runs: as many as runs are likely to be
/// at once (each test thread of `cargo test`, each thread of a caller's
/// pool), about 1.5 MB each. A pair given back when this many are kept
/// is freed.
const SPARES: usize = 4;

/// Pairs that runs gave back, reset: ready for the next runs on any
/// thread. (Not per thread: `cargo test` runs each test on a new thread,
/// which would build its own pair, and fault in fresh pages for it, where
/// taking a kept pair costs a lock.)
static SPARE: Mutex<Vec<(Box<Queues>, Box<TableOrchestrator>)>> = Mutex::new(Vec::new());

/// The dispatch queues and the orchestrator of one run: a spare pair if
/// one is kept, else new ones. Dropped, it resets them and gives them
/// back for a later run if fewer than four are kept, whether the run
/// finished or failed part way; after a panic they are freed (the panic
/// may have stopped the orchestrator inside a submission), and a later
/// run builds new ones.
pub struct RunState {
    parts: Option<(Box<Queues>, Box<TableOrchestrator>)>,
}

/// A spare run state, or a new one.
pub fn run_state() -> RunState {
    let spare = SPARE.lock().unwrap_or_else(PoisonError::into_inner).pop();
    let parts = spare.unwrap_or_else(|| (queues(), orchestrator()));
    RunState { parts: Some(parts) }
}

/// Pairs kept now for later runs.
pub fn spares() -> usize {
    SPARE.lock().unwrap_or_else(PoisonError::into_inner).len()
}

/// Frees the kept pairs (about 1.5 MB each): the next runs build new ones.
pub fn free_spares() {
    SPARE.lock().unwrap_or_else(PoisonError::into_inner).clear();
}

impl RunState {
    /// The queues (shared by the run's threads) and the orchestrator
    /// (the dispatcher's).
    pub fn split(&mut self) -> (&Queues, &mut TableOrchestrator) {
        let (queues, orch) = self.parts.as_mut().expect("taken only on drop");
        (queues, orch)
    }
}

impl Drop for RunState {
    fn drop(&mut self) {
        let Some((mut queues, mut orch)) = self.parts.take() else {
            return;
        };
        // A run that panicked may have stopped inside a submission: free
        // the pair rather than reason about what it left.
        if std::thread::panicking() {
            return;
        }
        // A pair that is kept is ready as a new one, whatever the run
        // (finished or failed part way) left in it.
        queues.reset();
        orch.reset();
        let mut spare = SPARE.lock().unwrap_or_else(PoisonError::into_inner);
        if spare.len() < SPARES {
            spare.push((queues, orch));
        }
    }
}
