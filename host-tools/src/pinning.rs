//! Pinning a threaded shim run's scheduler threads, one to a processor.
//!
//! Why: a run wakes or starts a host thread for each scheduler thread but
//! thread 0 (the caller's; see [`crate::workers`]), and the OS places a
//! new or woken thread by its load figures and by who
//! woke it, which can be the processor of another of the run's threads
//! while a processor idles. Two threads on one processor take turns (a
//! spinning one for a whole tick of the OS, 4 ms on a kernel with
//! `HZ = 250`), and the run measures one processor instead of two
//! (`BENCHMARKS.md`, "Seventh pass"). The device pins its AICPU threads
//! by construction; on the host, pinning is asked for with
//! [`Placement::Pinned`]. A worker thread pinned for a run is given the
//! caller's processors back when its part of the run ends.
//!
//! Linux only: elsewhere a pinned run is refused with
//! [`PinError::Unsupported`].

use std::fmt;

/// Where a threaded shim run's scheduler threads run on the host.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Placement {
    /// Where the OS puts them (and moves them).
    #[default]
    Os,
    /// Each thread on its own processor of those the calling thread may
    /// use ([`Pins::plan`]): the calling thread (thread 0) on the one it
    /// runs on, and its own set back after the run. Refused when it may
    /// use fewer processors than the run has threads.
    Pinned,
}

/// Why a pinned run could not pin its threads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PinError {
    /// The calling thread may use fewer processors than the run has threads.
    TooFewProcessors {
        /// Threads to pin.
        threads: usize,
        /// Processors the calling thread may use.
        processors: usize,
    },
    /// The host's OS has no thread affinity the shim can set.
    Unsupported,
    /// The OS refused to read or set a thread's affinity.
    Os(String),
}

impl fmt::Display for PinError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PinError::TooFewProcessors {
                threads,
                processors,
            } => write!(
                f,
                "cannot pin {threads} scheduler threads one to a processor: this thread may use {processors} processors"
            ),
            PinError::Unsupported => {
                write!(f, "pinning threads to processors is supported on Linux only")
            }
            PinError::Os(why) => write!(f, "pinning a thread to a processor: {why}"),
        }
    }
}

impl std::error::Error for PinError {}

#[cfg(target_os = "linux")]
mod os {
    use nix::sched::{sched_getaffinity, sched_setaffinity, CpuSet};
    use nix::unistd::Pid;

    use super::PinError;

    /// The calling thread's processor set.
    pub type Saved = CpuSet;

    fn failed(e: nix::Error) -> PinError {
        PinError::Os(e.to_string())
    }

    /// The calling thread's set (pid 0: the calling thread).
    pub fn current() -> Result<Saved, PinError> {
        sched_getaffinity(Pid::from_raw(0)).map_err(failed)
    }

    /// The processors in `set`, in ascending order.
    pub fn processors(set: &Saved) -> Vec<usize> {
        (0..CpuSet::count())
            .filter(|&cpu| set.is_set(cpu).unwrap_or(false))
            .collect()
    }

    /// The processor the calling thread runs on now.
    pub fn here() -> Option<usize> {
        nix::sched::sched_getcpu().ok()
    }

    /// Restricts the calling thread to processor `cpu`.
    pub fn pin(cpu: usize) -> Result<(), PinError> {
        let mut one = CpuSet::new();
        one.set(cpu).map_err(failed)?;
        sched_setaffinity(Pid::from_raw(0), &one).map_err(failed)
    }

    /// Gives the calling thread `set` back.
    pub fn restore(set: &Saved) -> Result<(), PinError> {
        sched_setaffinity(Pid::from_raw(0), set).map_err(failed)
    }
}

#[cfg(not(target_os = "linux"))]
mod os {
    use super::PinError;

    pub type Saved = ();

    pub fn current() -> Result<Saved, PinError> {
        Err(PinError::Unsupported)
    }

    pub fn processors(_: &Saved) -> Vec<usize> {
        Vec::new()
    }

    pub fn here() -> Option<usize> {
        None
    }

    pub fn pin(_: usize) -> Result<(), PinError> {
        Err(PinError::Unsupported)
    }

    pub fn restore(_: &Saved) -> Result<(), PinError> {
        Err(PinError::Unsupported)
    }
}

/// A run's pinning plan: the processor of each thread, and the calling
/// thread's set to give back.
pub struct Pins {
    cpus: Vec<usize>,
    saved: os::Saved,
}

impl Pins {
    /// One processor per thread, of those the calling thread may use:
    /// thread 0 (the calling thread) keeps the one it runs on, so that
    /// pinning it moves nothing it has in its caches; threads 1.. get the
    /// others in ascending order.
    pub fn plan(threads: usize) -> Result<Pins, PinError> {
        let saved = os::current()?;
        let mut cpus = os::processors(&saved);
        if cpus.len() < threads {
            return Err(PinError::TooFewProcessors {
                threads,
                processors: cpus.len(),
            });
        }
        if let Some(at) = os::here().and_then(|here| cpus.iter().position(|&c| c == here)) {
            let here = cpus.remove(at);
            cpus.insert(0, here);
        }
        cpus.truncate(threads);
        Ok(Pins { cpus, saved })
    }

    /// The processor of thread `t`.
    pub fn cpu(&self, t: usize) -> usize {
        self.cpus[t]
    }

    /// Pins the calling thread to thread `t`'s processor (`t` below the
    /// planned threads).
    pub fn pin(&self, t: usize) -> Result<(), PinError> {
        os::pin(self.cpus[t])
    }

    /// Gives the calling thread the set it had when the plan was made.
    pub fn restore(&self) -> Result<(), PinError> {
        os::restore(&self.saved)
    }
}

/// The processors the calling thread may use now, in ascending order.
pub fn processors() -> Result<Vec<usize>, PinError> {
    os::current().map(|set| os::processors(&set))
}

/// Pins the calling thread to the `index`-th processor it may use now
/// (for a benchmark's peer pools, placed as a pinned run is).
pub fn pin_to_nth(index: usize) -> Result<(), PinError> {
    let set = os::current()?;
    let cpus = os::processors(&set);
    match cpus.get(index) {
        Some(&cpu) => os::pin(cpu),
        None => Err(PinError::TooFewProcessors {
            threads: index + 1,
            processors: cpus.len(),
        }),
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// A plan gives each thread its own processor of the caller's set; a
    /// thread pinned by it may then run only there (the OS's own view,
    /// not the plan's), and gets its set back.
    #[test]
    fn pins_and_restores() {
        std::thread::spawn(|| {
            let before = processors().unwrap();
            let threads = before.len().min(2);
            let pins = Pins::plan(threads).unwrap();
            let planned: Vec<usize> = (0..threads).map(|t| pins.cpu(t)).collect();
            let mut distinct = planned.clone();
            distinct.sort_unstable();
            distinct.dedup();
            assert_eq!(distinct.len(), threads, "{planned:?}");
            assert!(planned.iter().all(|c| before.contains(c)), "{planned:?}");
            pins.pin(0).unwrap();
            assert_eq!(processors().unwrap(), vec![pins.cpu(0)]);
            pins.restore().unwrap();
            assert_eq!(processors().unwrap(), before);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn too_many_threads_is_refused() {
        let available = os::processors(&os::current().unwrap()).len();
        match Pins::plan(available + 1) {
            Err(PinError::TooFewProcessors {
                threads,
                processors,
            }) => assert_eq!((threads, processors), (available + 1, available)),
            other => panic!("expected TooFewProcessors, got {:?}", other.map(|p| p.cpus)),
        }
    }
}
