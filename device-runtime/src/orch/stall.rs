//! Backpressure bookkeeping: why submission stalls, how often, for how long,
//! and how full each resource has been.

use core::fmt;

/// The number of [`StallReason`]s.
pub const STALL_REASONS: usize = 7;

/// The resource a submission (or a process) waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StallReason {
    /// Every slot of the task window holds a task that has not retired.
    TaskRingFull,
    /// The TensorMap has no free entry for the new task's arguments.
    TensorMapPoolFull,
    /// The DepList pool has no free node for the new task's fan-in edges.
    DepListPoolFull,
    /// The heap ring has no contiguous room for the task's output buffer.
    HeapRingFull,
    /// A dispatch queue of a scheduler thread is full. The orchestrator's own
    /// ready lists are intrusive (through the task slots) and cannot fill;
    /// bounded per-thread dispatch queues report this reason.
    ReadyQueueFull,
    /// A process's `SEND` found its channel full (capacity 0: no consumer
    /// waiting). High water: the most tokens one channel held; capacity:
    /// the largest channel capacity.
    ChannelFull,
    /// A process's `CONSUME` found no token it could take yet (the channel
    /// empty and open, or its oldest token's task still running, or its
    /// latency not yet passed). High water: the most processes parked on
    /// empty channels at once; capacity: the most processes.
    ChannelEmpty,
}

impl StallReason {
    /// Every resource, in index order.
    pub const ALL: [StallReason; STALL_REASONS] = [
        StallReason::TaskRingFull,
        StallReason::TensorMapPoolFull,
        StallReason::DepListPoolFull,
        StallReason::HeapRingFull,
        StallReason::ReadyQueueFull,
        StallReason::ChannelFull,
        StallReason::ChannelEmpty,
    ];

    /// Its name, for reports.
    pub const fn name(self) -> &'static str {
        match self {
            StallReason::TaskRingFull => "TASK_RING_FULL",
            StallReason::TensorMapPoolFull => "TENSORMAP_POOL_FULL",
            StallReason::DepListPoolFull => "DEPLIST_POOL_FULL",
            StallReason::HeapRingFull => "HEAP_RING_FULL",
            StallReason::ReadyQueueFull => "READY_QUEUE_FULL",
            StallReason::ChannelFull => "CHANNEL_FULL",
            StallReason::ChannelEmpty => "CHANNEL_EMPTY",
        }
    }

    const fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for StallReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Figures for one resource.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ResourceStats {
    /// Submissions that found the resource full (a retried submission that
    /// finds it full again is the same stall, not a new one).
    pub stalls: u64,
    /// Ticks spent stalled on it (the caller's clock).
    pub stall_ticks: u64,
    /// Most units in use at once (slots, entries, nodes or bytes).
    pub high_water: u64,
    /// Capacity in the same units.
    pub capacity: u64,
}

/// Stall statistics of an orchestrator.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StallStats {
    /// Per resource, by [`StallReason`] index.
    pub resources: [ResourceStats; STALL_REASONS],
    /// What the submission in progress is waiting for, if anything.
    pub current: Option<StallReason>,
    since: u64,
}

impl StallStats {
    /// Statistics for resources of these capacities (in [`StallReason::ALL`] order).
    pub const fn new(capacity: [u64; STALL_REASONS]) -> Self {
        const ZERO: ResourceStats = ResourceStats {
            stalls: 0,
            stall_ticks: 0,
            high_water: 0,
            capacity: 0,
        };
        let mut resources = [ZERO; STALL_REASONS];
        let mut i = 0;
        while i < STALL_REASONS {
            resources[i].capacity = capacity[i];
            i += 1;
        }
        StallStats {
            resources,
            current: None,
            since: 0,
        }
    }

    /// The figures of one resource.
    pub fn of(&self, reason: StallReason) -> &ResourceStats {
        &self.resources[reason.index()]
    }

    #[inline]
    pub(crate) fn used(&mut self, reason: StallReason, used: u64) {
        let r = &mut self.resources[reason.index()];
        r.high_water = r.high_water.max(used);
    }

    /// A submission found `reason` full at `now`.
    pub(crate) fn stalled(&mut self, reason: StallReason, now: u64) {
        match self.current {
            Some(current) if current == reason => {}
            _ => {
                self.end(now);
                self.resources[reason.index()].stalls += 1;
                self.current = Some(reason);
                self.since = now;
            }
        }
    }

    /// A submission went through at `now`: any stall is over.
    pub(crate) fn end(&mut self, now: u64) {
        if let Some(reason) = self.current.take() {
            self.resources[reason.index()].stall_ticks += now.saturating_sub(self.since);
        }
    }
}
