//! The launch gate: whether server threads may enter the prepared launch,
//! and how many are inside, in one atomic word.
//!
//! CANN loads the program once per process and calls Init, then the server
//! on n threads, for every launch. Init of the next launch may replace the
//! per-launch statics only when no server thread of the last one is still
//! running: it moves the gate from open (or closed) with nobody inside to
//! *preparing* in one compare-and-swap, so that no thread enters while it
//! works, and opens it (or closes it, on bad arguments) when it is done.
//!
//! The AICPU program (`wsp-aicpu`) keeps one gate in a static. It is
//! written over the runtime's swappable atomics (`sync`), so the loom
//! model checker covers it (`RUSTFLAGS="--cfg loom" cargo test -p
//! device-runtime --release loom`).

use crate::sync::{AtomicU32, Ordering};

/// The low bits: server threads inside the launch.
const INSIDE: u32 = 0xFFFF;
/// The high bits: the phase.
const PHASE_SHIFT: u32 = 16;
/// No launch prepared: before the first Init, or after a refused one.
const CLOSED: u32 = 0;
/// An Init is replacing the per-launch statics.
const PREPARING: u32 = 1;
/// A prepared launch: server threads may enter.
const OPEN: u32 = 2;

/// Why Init may not start now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Busy {
    /// Server threads of the last launch that have not returned.
    Inside(u32),
    /// Another Init is running.
    Preparing,
}

/// The gate (one per program).
pub struct Gate(AtomicU32);

impl Default for Gate {
    fn default() -> Self {
        Gate::new()
    }
}

impl Gate {
    crate::sync::maybe_const_fn! {
        /// Closed, nobody inside.
        pub fn new() -> Self {
            Gate(AtomicU32::new(CLOSED << PHASE_SHIFT))
        }
    }

    /// Init: takes the gate for preparing a launch, when no server thread
    /// is inside and no other Init runs. On success the caller is the only
    /// one using the per-launch statics until [`Gate::end_init`]; what the
    /// last launch's threads wrote before they left is visible to it.
    pub fn begin_init(&self) -> Result<(), Busy> {
        let mut word = self.0.load(Ordering::Acquire);
        loop {
            if word >> PHASE_SHIFT == PREPARING {
                return Err(Busy::Preparing);
            }
            let inside = word & INSIDE;
            if inside != 0 {
                return Err(Busy::Inside(inside));
            }
            match self.0.compare_exchange_weak(
                word,
                PREPARING << PHASE_SHIFT,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Ok(()),
                Err(now) => word = now,
            }
        }
    }

    /// Init is done: the launch is open to the server threads (`open`), or
    /// closed (the arguments were refused). Publishes what Init wrote.
    pub fn end_init(&self, open: bool) {
        let phase = if open { OPEN } else { CLOSED };
        self.0.store(phase << PHASE_SHIFT, Ordering::Release);
    }

    /// A server thread: enters the open launch (then it must
    /// [`leave`](Gate::leave)), or `false` when no launch is open. Sees
    /// everything Init wrote.
    pub fn enter(&self) -> bool {
        let mut word = self.0.load(Ordering::Acquire);
        loop {
            if word >> PHASE_SHIFT != OPEN || word & INSIDE == INSIDE {
                return false;
            }
            match self
                .0
                .compare_exchange_weak(word, word + 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return true,
                Err(now) => word = now,
            }
        }
    }

    /// A server thread that [`enter`](Gate::enter)ed returns: after its
    /// last use of the per-launch statics.
    pub fn leave(&self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn init_waits_for_every_thread_inside_to_leave() {
        let gate = Gate::new();
        assert!(!gate.enter(), "closed before the first Init");
        gate.begin_init().unwrap();
        assert!(!gate.enter(), "nobody enters while Init prepares");
        assert_eq!(gate.begin_init(), Err(Busy::Preparing));
        gate.end_init(true);
        assert!(gate.enter() && gate.enter());
        assert_eq!(gate.begin_init(), Err(Busy::Inside(2)));
        gate.leave();
        assert_eq!(gate.begin_init(), Err(Busy::Inside(1)));
        gate.leave();
        gate.begin_init().unwrap();
        gate.end_init(false);
        assert!(!gate.enter(), "a refused Init closes the gate");
        gate.begin_init().unwrap();
        gate.end_init(true);
        assert!(gate.enter(), "open again");
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use crate::sync::UnsafeCell;
    use loom::sync::Arc;

    /// What a launch's Init prepares and its server threads read.
    struct Launch {
        gate: Gate,
        data: UnsafeCell<u32>,
    }

    // SAFETY: `data` is written only by a thread that holds the gate for
    // Init and read only by threads inside an open launch; loom checks in
    // every interleaving that the two never overlap.
    unsafe impl Sync for Launch {}

    fn init(launch: &Launch, value: u32) {
        while launch.gate.begin_init().is_err() {
            loom::thread::yield_now();
        }
        // SAFETY: the gate is held for Init: no server thread is inside,
        // and none enters until `end_init`.
        launch.data.with_mut(|p| unsafe { *p = value });
        launch.gate.end_init(true);
    }

    fn serve(launch: &Launch) -> Option<u32> {
        if !launch.gate.enter() {
            return None;
        }
        // SAFETY: inside an open launch, which no Init replaces until this
        // thread leaves.
        let value = launch.data.with(|p| unsafe { *p });
        launch.gate.leave();
        Some(value)
    }

    /// The next launch's Init never writes while a server thread of the
    /// last one reads (loom reports any such race), and a server thread
    /// that enters sees a whole prepared launch. (With `leave` or `enter`
    /// relaxed, loom reports the race.)
    #[test]
    fn init_never_overlaps_a_server_thread_inside() {
        loom::model(|| {
            let launch = Arc::new(Launch {
                gate: Gate::new(),
                data: UnsafeCell::new(0),
            });
            init(&launch, 1);
            let server = {
                let launch = launch.clone();
                loom::thread::spawn(move || serve(&launch))
            };
            init(&launch, 2);
            let seen = server.join().unwrap();
            // `None`: it came while the second Init prepared.
            assert_ne!(seen, Some(0), "a server thread saw an unprepared launch");
            assert_eq!(serve(&launch), Some(2));
        });
    }
}
