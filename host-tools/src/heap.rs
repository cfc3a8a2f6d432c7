//! Building the runtime's large statics (the dispatch [`Queues`] and the
//! [`TableOrchestrator`], hundreds of KiB each at the default task window)
//! on the heap for a host run.
//!
//! A `Box::new(Queues::new())` builds the value where the optimizer
//! likes: in release builds straight into the allocation, in debug builds
//! on the calling thread's stack first, which overflows the 2 MiB stacks
//! that test threads get. So debug builds build it on a short-lived thread
//! with a stack sized for the value.

use device_runtime::sched::{Queues, TableOrchestrator};

/// `make()` in a box, without a stack the size of the value in debug builds.
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
