//! Host threads kept between shim runs, lent to one run at a time.
//!
//! A threaded shim run needs a host thread for each scheduler thread but
//! the caller's and for each emulated AICore, for as long as the run
//! lasts: five for the default machine. Starting and joining a thread
//! costs 40-90 µs on the machines this project is measured on (`cargo
//! bench -p host-tools --bench small_runs`, its "thread" column), one
//! after another on the caller's thread; kept workers made a shim run of
//! up to 8 tasks 2-3.5x faster (its "shim" column, `BENCHMARKS.md`,
//! "Sixteenth pass"). Waking one blocked worker costs about what
//! starting one thread does on idle processors, so a run with a single
//! extra thread gains little. [`scope`] works as
//! [`std::thread::scope`] does, but its threads are workers that wait
//! (blocked on a condition variable, taking no processor) between jobs:
//! a spawn takes an idle worker, or starts one when none is idle, so
//! runs on several caller threads at once never wait for each other's
//! workers. At most [`MAX_IDLE`] workers wait; one that finishes a job
//! when that many do ends.
//!
//! Each job names its worker while it runs (`wsp-sched-1`, `wsp-core-3`;
//! Linux only), so that `perf report --sort comm,sym` still tells a run's
//! threads apart.

use std::marker::PhantomData;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// Workers that wait for a job at most; more end after their job. A shim
/// run of the default machine takes five (a second scheduler thread and
/// four AICores), and a test binary runs a few runs at once.
pub const MAX_IDLE: usize = 32;

/// A job with its lifetime erased (see [`Scope::spawn`]).
type Job = Box<dyn FnOnce() + Send + 'static>;

/// Locks `m`, also if a thread panicked while holding it: every value
/// these locks guard is whole between statements (jobs run outside them).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A worker thread's mailbox: the next job and the scope to tell when it
/// has run.
struct Worker {
    next: Mutex<Option<(Job, Arc<Pending>)>>,
    posted: Condvar,
}

/// Workers waiting for a job.
static IDLE: Mutex<Vec<Arc<Worker>>> = Mutex::new(Vec::new());

/// Jobs of a scope that have not finished yet.
#[derive(Default)]
struct Pending {
    left: Mutex<usize>,
    finished: Condvar,
}

impl Pending {
    fn finish(&self) {
        let mut left = lock(&self.left);
        *left -= 1;
        if *left == 0 {
            self.finished.notify_all();
        }
    }

    fn wait_all(&self) {
        let mut left = lock(&self.left);
        while *left > 0 {
            left = self
                .finished
                .wait(left)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
        }
    }
}

/// Hands `job` to an idle worker, or to a new one. Panics if the host
/// cannot start a thread (as [`std::thread::spawn`] does).
fn post(job: Job, pending: Arc<Pending>) {
    let idle = lock(&IDLE).pop();
    let worker = match idle {
        Some(worker) => worker,
        None => {
            let worker = Arc::new(Worker {
                next: Mutex::new(None),
                posted: Condvar::new(),
            });
            let own = Arc::clone(&worker);
            let started = std::thread::Builder::new()
                .name("wsp-worker".into())
                .spawn(move || work(&own));
            if let Err(e) = started {
                pending.finish();
                panic!("the host could not start a worker thread: {e}");
            }
            worker
        }
    };
    *lock(&worker.next) = Some((job, pending));
    worker.posted.notify_one();
}

/// A worker's life: run the jobs posted to it, wait in between.
fn work(me: &Arc<Worker>) {
    loop {
        let (job, pending) = {
            let mut next = lock(&me.next);
            loop {
                if let Some(posted) = next.take() {
                    break posted;
                }
                next = me
                    .posted
                    .wait(next)
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
            }
        };
        // The job catches its own panic, and everything it captured is
        // dropped when the call returns: only then is it finished.
        job();
        name_thread("wsp-worker");
        pending.finish();
        let mut idle = lock(&IDLE);
        if idle.len() >= MAX_IDLE {
            return;
        }
        idle.push(Arc::clone(me));
    }
}

/// Names the calling thread (Linux; elsewhere, and under Miri, which
/// cannot call `prctl`, the name stays the worker's). At most 15 bytes
/// are kept.
fn name_thread(name: &str) {
    #[cfg(all(target_os = "linux", not(miri)))]
    if let Ok(name) = std::ffi::CString::new(name) {
        // Only a debugging aid: a name the kernel refuses changes nothing.
        let _ = nix::sys::prctl::set_name(&name);
    }
    #[cfg(not(all(target_os = "linux", not(miri))))]
    let _ = name;
}

/// A scope for jobs that borrow from the caller's stack (see [`scope`]).
pub struct Scope<'scope, 'env: 'scope> {
    pending: Arc<Pending>,
    /// Invariant in both lifetimes, as [`std::thread::Scope`] is.
    scope: PhantomData<&'scope mut &'scope ()>,
    env: PhantomData<&'env mut &'env ()>,
}

/// A job's result, filled in when it has run.
type Outcome<T> = (Mutex<Option<std::thread::Result<T>>>, Condvar);

/// A job of a [`Scope`], to wait for.
pub struct Handle<'scope, T> {
    outcome: Arc<Outcome<T>>,
    scope: PhantomData<&'scope ()>,
}

impl<T> Handle<'_, T> {
    /// Waits for the job to finish: its value, or its panic's payload.
    pub fn join(self) -> std::thread::Result<T> {
        let (value, filled) = &*self.outcome;
        let mut value = lock(value);
        loop {
            if let Some(outcome) = value.take() {
                return outcome;
            }
            value = filled
                .wait(value)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
        }
    }
}

/// Runs `f` with a scope whose jobs run on worker threads, and returns
/// when `f` has returned and every job it spawned has finished (also when
/// `f` panics: then after the jobs, the panic goes on).
pub fn scope<'env, T>(f: impl for<'scope> FnOnce(&'scope Scope<'scope, 'env>) -> T) -> T {
    let scope = Scope {
        pending: Arc::new(Pending::default()),
        scope: PhantomData,
        env: PhantomData,
    };
    /// Waits for the scope's jobs when dropped: on return and on unwind.
    struct WaitAll<'a>(&'a Pending);
    impl Drop for WaitAll<'_> {
        fn drop(&mut self) {
            self.0.wait_all();
        }
    }
    let _wait = WaitAll(&scope.pending);
    f(&scope)
}

impl<'scope> Scope<'scope, '_> {
    /// Runs `f` on a worker thread called `name` while it runs; its
    /// handle gives its value.
    pub fn spawn<F, T>(&'scope self, name: &str, f: F) -> Handle<'scope, T>
    where
        F: FnOnce() -> T + Send + 'scope,
        T: Send + 'scope,
    {
        let outcome: Arc<Outcome<T>> = Arc::new((Mutex::new(None), Condvar::new()));
        let theirs = Arc::clone(&outcome);
        let name = name.to_string();
        let job = move || {
            name_thread(&name);
            let value = catch_unwind(AssertUnwindSafe(f));
            let (slot, filled) = &*theirs;
            *lock(slot) = Some(value);
            filled.notify_all();
        };
        let job: Box<dyn FnOnce() + Send + 'scope> = Box::new(job);
        // SAFETY: the job may borrow what lives for 'scope; erasing that
        // lifetime is sound because the job runs, and is dropped with
        // everything it captured, before it is counted finished (`work`
        // calls it, and only then `Pending::finish`), and `scope` does
        // not return or unwind past its frame, where 'scope ends, until
        // every job it counted has finished (`WaitAll`). The count is
        // raised before the job is posted, so no job goes uncounted; a
        // job that cannot be posted is counted finished at once, and is
        // dropped unrun in the same frame. The handle cannot outlive the
        // scope ('scope), and a value the handle left untaken is dropped
        // with the job's captures (the last `Arc` of the outcome) or with
        // the handle, both within 'scope.
        let job: Job =
            unsafe { std::mem::transmute::<Box<dyn FnOnce() + Send + 'scope>, Job>(job) };
        *lock(&self.pending.left) += 1;
        post(job, Arc::clone(&self.pending));
        Handle {
            outcome,
            scope: PhantomData,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Jobs borrow the caller's stack, run at the same time (each waits
    /// for all to have started), and give their values back; a worker
    /// freed by one scope serves the next.
    #[test]
    fn jobs_borrow_run_together_and_return_values() {
        let started = AtomicUsize::new(0);
        let words = ["a", "bb", "ccc"];
        for _round in 0..3 {
            started.store(0, Ordering::SeqCst);
            let lengths = scope(|s| {
                let handles: Vec<_> = words
                    .iter()
                    .map(|w| {
                        let started = &started;
                        s.spawn("wsp-test", move || {
                            started.fetch_add(1, Ordering::SeqCst);
                            let since = std::time::Instant::now();
                            while started.load(Ordering::SeqCst) < words.len() {
                                assert!(since.elapsed().as_secs() < 60, "jobs ran one at a time");
                                std::thread::yield_now();
                            }
                            w.len()
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| h.join().unwrap())
                    .collect::<Vec<_>>()
            });
            assert_eq!(lengths, [1, 2, 3]);
        }
    }

    /// A job's panic reaches its handle, and the worker serves on.
    #[test]
    fn a_panic_reaches_the_handle() {
        let outcome = scope(|s| s.spawn("wsp-test", || panic!("job failed")).join());
        let payload = outcome.unwrap_err();
        assert_eq!(payload.downcast_ref::<&str>(), Some(&"job failed"));
        assert_eq!(scope(|s| s.spawn("wsp-test", || 7).join().unwrap()), 7);
    }

    /// `scope` returns only after every job has finished, also those
    /// whose handle was dropped unjoined.
    #[test]
    fn the_scope_waits_for_unjoined_jobs() {
        let done = AtomicUsize::new(0);
        scope(|s| {
            for _ in 0..4 {
                let done = &done;
                drop(s.spawn("wsp-test", move || {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                    done.fetch_add(1, Ordering::SeqCst);
                }));
            }
        });
        assert_eq!(done.load(Ordering::SeqCst), 4);
    }
}
