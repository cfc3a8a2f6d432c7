//! Dispatch policies: which scheduler thread a ready task goes to, and
//! whether idle threads may steal. One trait, so users can write their own
//! ([`DispatchPolicy`]); the built-in ones are chosen by name at run time
//! ([`PolicyKind`], [`Policy`]). There is no fallback: a name the build does
//! not know is an error ([`PolicyError`]).

use wsp_ffi::CoreKind;

use crate::abi::schedule::{DispatchKey, PolicyError, PolicyKind};
use crate::abi::Table;
use crate::expand::TaskSpec;

/// Most scheduler threads (the device's AICPU has up to 4).
pub const MAX_THREADS: usize = 4;

/// What a policy knows about a ready task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TaskInfo {
    /// Its number in the run (program order).
    pub index: u32,
    /// Its kernel.
    pub kernel_id: u32,
    /// The kind of core it runs on.
    pub kind: CoreKind,
    /// The dispatch key ([`DispatchKey`]) computed from the task.
    pub key: u64,
}

/// Where a policy puts a task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// The dispatch queue of eligible thread `i` (`i < threads`, see
    /// [`DispatchPolicy::place`]).
    Thread(usize),
    /// The queue every thread takes from.
    Shared,
}

/// Load the dispatcher sees when it places a task.
#[derive(Clone, Copy, Debug, Default)]
pub struct Load {
    /// Tasks waiting in each eligible thread's dispatch queue.
    pub queued: [usize; MAX_THREADS],
    /// Times so far that a thread had idle cores and nothing to take while
    /// another thread's queue held tasks of the same kind (and stealing
    /// was off): the cost of static placement, as the threads saw it.
    pub starved: u64,
}

/// A dispatch policy. `place` runs on the dispatcher for every ready task;
/// `steals` is read by the scheduler threads whenever one has idle cores
/// and an empty queue.
pub trait DispatchPolicy {
    /// The policy's name, for reports.
    fn name(&self) -> &'static str;
    /// Chooses among the `threads` threads that own cores of `task.kind`.
    fn place(&mut self, task: &TaskInfo, threads: usize, load: &Load) -> Placement;
    /// Whether `place` reads [`Load::queued`]. The dispatcher fills it in
    /// (reading each eligible thread's queue, lines those threads write)
    /// only for policies that say yes; the others get zeros there.
    fn reads_queued(&self) -> bool {
        true
    }
    /// Whether the policy may change its mind: `observe` does something,
    /// or `steals`, `keeps_released` or `decision` may change during a
    /// run. The dispatcher reads the load after its rounds, and tells the
    /// threads what the policies allow again, only when some policy of the
    /// run says yes. Read once, when the dispatcher is made.
    fn observes(&self) -> bool {
        true
    }
    /// Called by the dispatcher after every dispatch round in which it
    /// placed tasks or threads starved again ([`Load::starved`] grew), also
    /// when no task was ready, with `queued[t]` the tasks in thread `t`'s
    /// dispatch queues (both kinds): lets a policy change its mind while
    /// the tasks it already placed run (an adaptive policy sees starvation
    /// only then).
    fn observe(&mut self, _load: &Load) {}
    /// Whether an idle thread may take single tasks from others' queues now.
    fn steals(&self) -> bool {
        false
    }
    /// Whether a scheduler thread that releases a task (its last producer
    /// completed there) keeps it in its own queue rather than handing it to
    /// the dispatcher to place by [`DispatchPolicy::place`]. Keeping is
    /// work-first: a chain stays on one thread and its cores, and no
    /// completion waits for the dispatcher's thread; only policies that
    /// balance by stealing anyway say yes. Asked after every dispatch round.
    fn keeps_released(&self) -> bool {
        false
    }
    /// What the policy decided, for reports (adaptive policies change
    /// their mind; the others always say their name).
    fn decision(&self) -> &'static str {
        self.name()
    }
}

/// What a task lacks for a dispatch key: it has only `has` of `what`
/// (scalars, tensor arguments, dimensions of the named argument, or loops
/// around its call) and the key names one past them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lacks {
    /// How many of them the task has.
    pub has: u32,
    /// What they are, in words: "scalars", "tensor arguments", ...
    pub what: &'static str,
}

/// Whether `key` names only what a task has: `scalars` scalars, `args`
/// tensor arguments, argument `a` of rank `rank_of(a)`, and `loops` loops
/// around its call (`None` for a task of the tasks section, which has
/// none: a loop key is refused for it, as for a call outside its loops).
/// A task's stream is a key every task has: a task on no stream has
/// stream 0.
pub fn check_key(
    key: DispatchKey,
    scalars: usize,
    args: usize,
    rank_of: impl Fn(usize) -> usize,
    loops: Option<usize>,
) -> Result<(), Lacks> {
    let lacks = |has: usize, what| {
        Err(Lacks {
            has: has as u32,
            what,
        })
    };
    match key {
        DispatchKey::TaskIndex | DispatchKey::Stream => Ok(()),
        DispatchKey::Scalar(n) if n as usize >= scalars => lacks(scalars, "scalars"),
        DispatchKey::Tile { arg, .. } if arg as usize >= args => lacks(args, "tensor arguments"),
        DispatchKey::Tile { arg, dim } if dim as usize >= rank_of(arg as usize) => {
            lacks(rank_of(arg as usize), "dimensions in that tensor argument")
        }
        DispatchKey::Loop(n) if n as usize >= loops.unwrap_or(0) => {
            lacks(loops.unwrap_or(0), "loops around its call")
        }
        _ => Ok(()),
    }
}

impl DispatchKey {
    /// The key of `task`, the run's task number `index`, whose tensors
    /// are `table`'s; what the task lacks if the key names a scalar,
    /// argument, dimension or loop it does not have ([`check_key`]).
    pub fn of(&self, task: &TaskSpec, index: u64, table: &Table<'_>) -> Result<u64, Lacks> {
        let rank_of = |a: usize| {
            let tensor = task.args()[a].tensor as usize;
            table
                .tensors()
                .get(tensor)
                .map_or(0, |t| t.rank.get() as usize)
        };
        let loops = task.pc.map(|_| task.loops.len());
        let (scalars, args) = (task.scalars.len(), task.args.len());
        check_key(*self, scalars, args, rank_of, loops)?;
        Ok(self.value(task, index))
    }

    /// The key of `task`, the run's task number `index`, for a task that
    /// was checked to have what the key names (a task of the tasks
    /// section: the run checks them all before it starts); 0 for anything
    /// it lacks, never a panic.
    pub fn value(&self, task: &TaskSpec, index: u64) -> u64 {
        match *self {
            DispatchKey::TaskIndex => index,
            DispatchKey::Scalar(n) => task.scalars().get(n as usize).copied().unwrap_or(0),
            DispatchKey::Tile { arg, dim } => task.args().get(arg as usize).map_or(0, |a| {
                let (offset, extent) =
                    (a.region.offset[dim as usize], a.region.extent[dim as usize]);
                (offset / extent.max(1)) as u64
            }),
            DispatchKey::Stream => task.stream as u64,
            DispatchKey::Loop(n) => task.loops.get(n as usize).map_or(0, |&i| i as u64),
        }
    }
}

/// Tasks go to threads in turn.
#[derive(Clone, Copy, Debug, Default)]
pub struct RoundRobin {
    next: usize,
}

impl DispatchPolicy for RoundRobin {
    fn name(&self) -> &'static str {
        "round-robin"
    }
    fn place(&mut self, _: &TaskInfo, threads: usize, _: &Load) -> Placement {
        self.next = (self.next + 1) % threads;
        Placement::Thread(self.next)
    }
    fn reads_queued(&self) -> bool {
        false
    }
    fn observes(&self) -> bool {
        false
    }
}

/// Key modulo threads: placement by key for [`Affinity`] and the policies
/// that start from it.
#[cfg_attr(
    not(any(
        feature = "policy-affinity",
        feature = "policy-work-stealing",
        feature = "policy-adaptive"
    )),
    allow(dead_code)
)]
fn by_key(task: &TaskInfo, threads: usize) -> Placement {
    Placement::Thread((task.key % threads as u64) as usize)
}

/// Tasks with the same key go to the same thread: key modulo threads, so
/// consecutive keys (batches, row blocks) spread evenly.
#[cfg(feature = "policy-affinity")]
#[derive(Clone, Copy, Debug, Default)]
pub struct Affinity;

#[cfg(feature = "policy-affinity")]
impl DispatchPolicy for Affinity {
    fn name(&self) -> &'static str {
        "affinity"
    }
    fn place(&mut self, task: &TaskInfo, threads: usize, _: &Load) -> Placement {
        by_key(task, threads)
    }
    fn reads_queued(&self) -> bool {
        false
    }
    fn observes(&self) -> bool {
        false
    }
}

/// Tasks with the same key go to the same thread, chosen by a hash of the
/// key, so that keys with a common stride do not pile onto one thread.
#[cfg(feature = "policy-hash")]
#[derive(Clone, Copy, Debug, Default)]
pub struct Hash;

/// SplitMix64's finaliser: a cheap, well-mixing hash of a key.
pub fn mix(key: u64) -> u64 {
    let mut z = key.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(feature = "policy-hash")]
impl DispatchPolicy for Hash {
    fn name(&self) -> &'static str {
        "hash"
    }
    fn place(&mut self, task: &TaskInfo, threads: usize, _: &Load) -> Placement {
        Placement::Thread((mix(task.key) % threads as u64) as usize)
    }
    fn reads_queued(&self) -> bool {
        false
    }
    fn observes(&self) -> bool {
        false
    }
}

/// Tasks ready when submitted are placed by key, like [`Affinity`]
/// (locality first); a task released by a completion stays with the thread
/// that observed the completion (work-first: a chain stays on one thread
/// and its cores); a thread whose cores are idle and whose queues are empty
/// steals single tasks from the others.
#[cfg(feature = "policy-work-stealing")]
#[derive(Clone, Copy, Debug, Default)]
pub struct WorkStealing;

#[cfg(feature = "policy-work-stealing")]
impl DispatchPolicy for WorkStealing {
    fn name(&self) -> &'static str {
        "work-stealing"
    }
    fn place(&mut self, task: &TaskInfo, threads: usize, _: &Load) -> Placement {
        by_key(task, threads)
    }
    fn reads_queued(&self) -> bool {
        false
    }
    fn observes(&self) -> bool {
        false
    }
    fn steals(&self) -> bool {
        true
    }
    fn keeps_released(&self) -> bool {
        true
    }
}

/// Every task goes to one queue that all threads take from.
#[cfg(feature = "policy-shared")]
#[derive(Clone, Copy, Debug, Default)]
pub struct SharedQueue;

#[cfg(feature = "policy-shared")]
impl DispatchPolicy for SharedQueue {
    fn name(&self) -> &'static str {
        "shared"
    }
    fn place(&mut self, _: &TaskInfo, _: usize, _: &Load) -> Placement {
        Placement::Shared
    }
    fn reads_queued(&self) -> bool {
        false
    }
    fn observes(&self) -> bool {
        false
    }
}

/// Starts static (placement by key, no stealing) and switches to stealing,
/// for the rest of the run, once threads have been starved
/// ([`Load::starved`]) [`Adaptive::IMBALANCE`] times: idle cores and an
/// empty queue while another thread had a backlog. A momentary difference
/// in queue lengths (a burst placed on one thread just before the next) is
/// not imbalance; a thread that finds nothing to do is.
/// [`DispatchPolicy::decision`] says which it runs.
#[cfg(feature = "policy-adaptive")]
#[derive(Clone, Copy, Debug, Default)]
pub struct Adaptive {
    stealing: bool,
    /// Tasks placed before it switched (for reports).
    switched_after: u64,
    placed: u64,
}

#[cfg(feature = "policy-adaptive")]
impl Adaptive {
    /// Starved observations that count as imbalance.
    pub const IMBALANCE: u64 = 4;

    /// `Some(n)` once it switched to stealing after placing `n` tasks.
    pub fn switched_after(&self) -> Option<u64> {
        self.stealing.then_some(self.switched_after)
    }
}

#[cfg(feature = "policy-adaptive")]
impl DispatchPolicy for Adaptive {
    fn name(&self) -> &'static str {
        "adaptive"
    }
    fn place(&mut self, task: &TaskInfo, threads: usize, load: &Load) -> Placement {
        if threads > 1 {
            self.observe(load);
        }
        self.placed += 1;
        by_key(task, threads)
    }
    fn reads_queued(&self) -> bool {
        false
    }
    fn observe(&mut self, load: &Load) {
        if !self.stealing && load.starved >= Self::IMBALANCE {
            self.stealing = true;
            self.switched_after = self.placed;
        }
    }
    fn steals(&self) -> bool {
        self.stealing
    }
    fn keeps_released(&self) -> bool {
        self.stealing
    }
    fn decision(&self) -> &'static str {
        if self.stealing {
            "adaptive: chose work stealing (queues out of balance)"
        } else {
            "adaptive: kept static placement (queues stayed balanced)"
        }
    }
}

/// Built by the scheduler, where the policies live.
impl PolicyKind {
    /// A fresh policy of this kind, if this build has it.
    pub fn build(self) -> Result<Policy, PolicyError> {
        Ok(match self {
            PolicyKind::RoundRobin => Policy::RoundRobin(RoundRobin::default()),
            #[cfg(feature = "policy-affinity")]
            PolicyKind::Affinity => Policy::Affinity(Affinity),
            #[cfg(feature = "policy-hash")]
            PolicyKind::Hash => Policy::Hash(Hash),
            #[cfg(feature = "policy-work-stealing")]
            PolicyKind::WorkStealing => Policy::WorkStealing(WorkStealing),
            #[cfg(feature = "policy-shared")]
            PolicyKind::Shared => Policy::Shared(SharedQueue),
            #[cfg(feature = "policy-adaptive")]
            PolicyKind::Adaptive => Policy::Adaptive(Adaptive::default()),
            #[allow(unreachable_patterns)]
            other => return Err(PolicyError::NotBuilt(other)),
        })
    }
}

/// A built-in policy as a value (no `alloc`, so no boxed trait objects).
#[derive(Clone, Copy, Debug)]
pub enum Policy {
    /// [`RoundRobin`].
    RoundRobin(RoundRobin),
    #[cfg(feature = "policy-affinity")]
    /// [`Affinity`].
    Affinity(Affinity),
    #[cfg(feature = "policy-hash")]
    /// [`Hash`](struct@Hash).
    Hash(Hash),
    #[cfg(feature = "policy-work-stealing")]
    /// [`WorkStealing`].
    WorkStealing(WorkStealing),
    #[cfg(feature = "policy-shared")]
    /// [`SharedQueue`].
    Shared(SharedQueue),
    #[cfg(feature = "policy-adaptive")]
    /// [`Adaptive`].
    Adaptive(Adaptive),
}

/// `match` over every built variant of [`Policy`], binding the policy to `$p`.
macro_rules! each_policy {
    ($policy:expr, $p:ident => $body:expr) => {
        match $policy {
            Policy::RoundRobin($p) => $body,
            #[cfg(feature = "policy-affinity")]
            Policy::Affinity($p) => $body,
            #[cfg(feature = "policy-hash")]
            Policy::Hash($p) => $body,
            #[cfg(feature = "policy-work-stealing")]
            Policy::WorkStealing($p) => $body,
            #[cfg(feature = "policy-shared")]
            Policy::Shared($p) => $body,
            #[cfg(feature = "policy-adaptive")]
            Policy::Adaptive($p) => $body,
        }
    };
}

/// Each call a `match` to the variant's own method (no second dynamic
/// call: `place` runs for every task).
impl DispatchPolicy for Policy {
    fn name(&self) -> &'static str {
        each_policy!(self, p => p.name())
    }
    fn place(&mut self, task: &TaskInfo, threads: usize, load: &Load) -> Placement {
        each_policy!(self, p => p.place(task, threads, load))
    }
    fn reads_queued(&self) -> bool {
        each_policy!(self, p => p.reads_queued())
    }
    fn observes(&self) -> bool {
        each_policy!(self, p => p.observes())
    }
    fn observe(&mut self, load: &Load) {
        each_policy!(self, p => p.observe(load))
    }
    fn steals(&self) -> bool {
        each_policy!(self, p => p.steals())
    }
    fn keeps_released(&self) -> bool {
        each_policy!(self, p => p.keeps_released())
    }
    fn decision(&self) -> &'static str {
        each_policy!(self, p => p.decision())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(key: u64) -> TaskInfo {
        TaskInfo {
            index: 0,
            kernel_id: 0,
            kind: CoreKind::Vector,
            key,
        }
    }

    fn thread_of(p: &mut dyn DispatchPolicy, key: u64, threads: usize) -> usize {
        match p.place(&task(key), threads, &Load::default()) {
            Placement::Thread(t) => t,
            Placement::Shared => panic!("{} placed on the shared queue", p.name()),
        }
    }

    /// Which policies this build should have, from the features directly.
    fn expected_built(kind: PolicyKind) -> bool {
        match kind {
            PolicyKind::RoundRobin => true,
            PolicyKind::Affinity => cfg!(feature = "policy-affinity"),
            PolicyKind::Hash => cfg!(feature = "policy-hash"),
            PolicyKind::WorkStealing => cfg!(feature = "policy-work-stealing"),
            PolicyKind::Shared => cfg!(feature = "policy-shared"),
            PolicyKind::Adaptive => cfg!(feature = "policy-adaptive"),
        }
    }

    /// A policy that says it does not read the queue lengths places every
    /// task the same whatever they are (the dispatcher gives it zeros).
    #[test]
    fn policies_that_do_not_read_queue_lengths_place_the_same_without_them() {
        let mut checked = 0;
        for kind in PolicyKind::ALL {
            let (Ok(mut with), Ok(mut without)) = (kind.build(), kind.build()) else {
                continue;
            };
            if with.reads_queued() {
                continue;
            }
            for key in 0..50u64 {
                let full = Load {
                    queued: [key as usize % 7, 200, 0, 31],
                    starved: key / 10,
                };
                let zeros = Load {
                    starved: key / 10,
                    ..Load::default()
                };
                let (a, b) = (
                    with.place(&task(key * 13), 3, &full),
                    without.place(&task(key * 13), 3, &zeros),
                );
                assert_eq!(a, b, "{} key {key}", kind.name());
            }
            checked += 1;
        }
        assert!(checked >= 1);
    }

    /// A policy that says it does not observe keeps its mind whatever the
    /// load: the dispatcher does not tell it the load, nor publish its
    /// steals again.
    #[test]
    fn policies_that_do_not_observe_never_change_their_mind() {
        let mut checked = 0;
        for kind in PolicyKind::ALL {
            let Ok(mut p) = kind.build() else { continue };
            if p.observes() {
                continue;
            }
            let before = (p.steals(), p.keeps_released(), p.decision());
            for starved in [0, 1, 10, 1000, u64::MAX] {
                let load = Load {
                    queued: [500, 0, 0, 0],
                    starved,
                };
                p.observe(&load);
                p.place(&task(starved), 2, &load);
                let now = (p.steals(), p.keeps_released(), p.decision());
                assert_eq!(now, before, "{} after starved {starved}", kind.name());
            }
            checked += 1;
        }
        assert!(checked >= 1);
        #[cfg(feature = "policy-adaptive")]
        assert!(PolicyKind::Adaptive.build().unwrap().observes());
    }

    #[test]
    fn names_round_trip_and_unknown_or_unbuilt_policies_are_errors() {
        for kind in PolicyKind::ALL {
            if expected_built(kind) {
                assert_eq!(PolicyKind::parse(kind.name()), Ok(kind));
                assert_eq!(kind.build().unwrap().name(), kind.name());
            } else {
                // `cargo test -p device-runtime --no-default-features` (in CI).
                let err = PolicyError::NotBuilt(kind);
                assert_eq!(PolicyKind::parse(kind.name()), Err(err));
                assert_eq!(kind.build().err(), Some(err));
                let text = std::format!("{err}");
                assert!(
                    text.contains(kind.name()) && text.contains("not in this build"),
                    "{text}"
                );
                assert!(text.contains("this build supports: round-robin"), "{text}");
            }
        }
        let err = PolicyKind::parse("gang").unwrap_err();
        assert_eq!(err, PolicyError::Unknown);
        let text = std::format!("{err}");
        assert!(text.contains("round-robin"), "{text}");
        if cfg!(feature = "all-policies") {
            assert!(
                text.contains("work-stealing") && text.contains("adaptive"),
                "{text}"
            );
        }
    }

    #[test]
    fn round_robin_cycles() {
        let mut rr = RoundRobin::default();
        let seq: std::vec::Vec<_> = (0..6).map(|_| thread_of(&mut rr, 7, 3)).collect();
        assert_eq!(seq, [1, 2, 0, 1, 2, 0]);
    }

    #[cfg(feature = "all-policies")]
    #[test]
    fn key_policies_are_stable() {
        for key in 0..100 {
            assert_eq!(thread_of(&mut Affinity, key, 3), (key % 3) as usize);
            let h = thread_of(&mut Hash, key, 3);
            assert_eq!(thread_of(&mut Hash, key, 3), h, "same key, same thread");
        }
        // A stride that Affinity maps onto one thread spreads under Hash.
        let used: std::collections::BTreeSet<_> =
            (0..32).map(|i| thread_of(&mut Hash, i * 4, 4)).collect();
        assert!(used.len() > 1, "hash spreads keys of stride 4: {used:?}");
        assert!(!Affinity.steals() && WorkStealing.steals());
        assert_eq!(
            SharedQueue.place(&task(1), 4, &Load::default()),
            Placement::Shared
        );
    }

    #[cfg(feature = "policy-adaptive")]
    #[test]
    fn adaptive_switches_to_stealing_on_imbalance_only() {
        let mut a = Adaptive::default();
        let balanced = Load {
            queued: [9, 0, 3, 2],
            starved: 3,
        };
        for k in 0..10 {
            a.place(&task(k), 4, &balanced);
        }
        assert!(!a.steals());
        assert!(a.decision().contains("static"));
        let skewed = Load {
            queued: [9, 0, 1, 1],
            starved: 4,
        };
        a.place(&task(0), 4, &skewed);
        assert!(a.steals());
        assert_eq!(a.switched_after(), Some(10));
        assert!(a.decision().contains("stealing"));
        // Starvation seen between placements switches it too.
        let mut b = Adaptive::default();
        b.place(&task(0), 4, &balanced);
        b.observe(&balanced);
        assert!(!b.steals());
        b.observe(&skewed);
        assert_eq!(b.switched_after(), Some(1));
    }
}
