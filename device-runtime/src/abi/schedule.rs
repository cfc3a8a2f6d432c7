//! Schedule encodings: the built-in dispatch policies by name
//! ([`PolicyKind`]), how a task's dispatch key is computed ([`DispatchKey`]),
//! and a taskset's schedule packed in 32 bits ([`Schedule`]), as the
//! workload program's `DISPATCH` instruction and the launch block carry them.
//! The policies themselves live in the scheduler (`sched::policy`).

use core::fmt;

use super::layout::{MAX_RANK, MAX_SCALARS, MAX_TENSOR_ARGS};
use super::program::MAX_LOOP_DEPTH;

/// How the dispatch key of a task is computed, for the key-based policies.
/// A task that lacks the scalar, argument, dimension or loop its key
/// names gets key 0; a run whose key no task of its taskset has fails (the
/// scheduler's `RunError::KeyInNoTask`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum DispatchKey {
    /// The task's number in the run (its index in the tasks section, then
    /// the program's tasks in expansion order).
    #[default]
    TaskIndex,
    /// The value of scalar `n`.
    Scalar(u8),
    /// The tile index of argument `arg` along tensor dimension `dim`
    /// (region offset / region extent): a loop index, e.g. the batch or the
    /// output row block of a tiled GEMM.
    Tile {
        /// The tensor argument, numbered from 0.
        arg: u8,
        /// The dimension of its tensor, 0 outermost.
        dim: u8,
    },
    /// The task's stream (0 for none): with affinity, hash or stealing, a
    /// stream's tasks go to one thread, which then issues them in order
    /// without waiting for another thread's issue report.
    Stream,
    /// The index of the program loop at nesting level `n` (0 = outermost)
    /// around the task's call, e.g. the expert of an MoE layer (0 for
    /// tasks of the tasks section).
    Loop(u8),
}

impl DispatchKey {
    /// The key's encoding in a program's `DISPATCH` instruction: kind, then
    /// two parameters (see [`Schedule::encode`]).
    const fn code(self) -> [u8; 3] {
        match self {
            DispatchKey::TaskIndex => [0, 0, 0],
            DispatchKey::Scalar(n) => [1, n, 0],
            DispatchKey::Tile { arg, dim } => [2, arg, dim],
            DispatchKey::Stream => [3, 0, 0],
            DispatchKey::Loop(n) => [4, n, 0],
        }
    }

    /// The key encoded as `code`, if it is one whose parameters are in
    /// range (a scalar, argument, dimension or loop level a task can have).
    fn from_code(code: [u8; 3]) -> Option<DispatchKey> {
        let [kind, a, b] = code;
        let key = match kind {
            0 => DispatchKey::TaskIndex,
            1 if (a as usize) < MAX_SCALARS => DispatchKey::Scalar(a),
            2 if (a as usize) < MAX_TENSOR_ARGS && (b as usize) < MAX_RANK => {
                DispatchKey::Tile { arg: a, dim: b }
            }
            3 => DispatchKey::Stream,
            4 if (a as usize) < MAX_LOOP_DEPTH => DispatchKey::Loop(a),
            _ => return None,
        };
        // Unused parameters must be 0, so that the encoding is unique.
        (key.code() == code).then_some(key)
    }
}

/// A taskset's schedule: its dispatch policy and key. A workload program
/// gives each taskset one (the `DISPATCH` instruction,
/// [`OP_DISPATCH`](super::program::OP_DISPATCH)); taskset 0 runs with the
/// run's own policy and key (the scheduler's `SchedConfig`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Schedule {
    /// The taskset's dispatch policy.
    pub policy: PolicyKind,
    /// The taskset's dispatch key.
    pub key: DispatchKey,
}

impl Schedule {
    /// Packs the schedule in 32 bits: policy, key kind, key parameters,
    /// one byte each (low to high).
    pub const fn encode(self) -> u32 {
        let [kind, a, b] = self.key.code();
        self.policy.code() as u32 | (kind as u32) << 8 | (a as u32) << 16 | (b as u32) << 24
    }

    /// The schedule packed as `bits` by [`Schedule::encode`], if valid
    /// (whether the build has the policy is checked at launch).
    pub fn decode(bits: u32) -> Option<Schedule> {
        let [policy, kind, a, b] = bits.to_le_bytes();
        Some(Schedule {
            policy: *PolicyKind::ALL.get(policy as usize)?,
            key: DispatchKey::from_code([kind, a, b])?,
        })
    }
}

/// A dispatch key written as text that is not one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BadKey;

impl fmt::Display for BadKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("expected task, scalar:N, tile:ARG:DIM, stream or loop:N (N 0-255)")
    }
}

impl core::str::FromStr for DispatchKey {
    type Err = BadKey;

    /// The key as [`DispatchKey`]'s `Display` writes it: `task`,
    /// `scalar:N`, `tile:ARG:DIM`, `stream` or `loop:N`.
    fn from_str(text: &str) -> Result<Self, BadKey> {
        let num = |s: &str| s.parse::<u8>().map_err(|_| BadKey);
        let mut parts = text.split(':');
        let head = parts.next();
        let rest = [parts.next(), parts.next(), parts.next()];
        match (head, rest) {
            (Some("task"), [None, ..]) => Ok(DispatchKey::TaskIndex),
            (Some("stream"), [None, ..]) => Ok(DispatchKey::Stream),
            (Some("loop"), [Some(n), None, _]) => Ok(DispatchKey::Loop(num(n)?)),
            (Some("scalar"), [Some(n), None, _]) => Ok(DispatchKey::Scalar(num(n)?)),
            (Some("tile"), [Some(a), Some(d), None]) => Ok(DispatchKey::Tile {
                arg: num(a)?,
                dim: num(d)?,
            }),
            _ => Err(BadKey),
        }
    }
}

impl fmt::Display for DispatchKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            DispatchKey::TaskIndex => f.write_str("task"),
            DispatchKey::Scalar(n) => write!(f, "scalar:{n}"),
            DispatchKey::Tile { arg, dim } => write!(f, "tile:{arg}:{dim}"),
            DispatchKey::Stream => f.write_str("stream"),
            DispatchKey::Loop(n) => write!(f, "loop:{n}"),
        }
    }
}

/// The built-in policies, by name.
///
/// No `Default`: the default schedule is the scheduler's
/// (`sched::DEFAULT_POLICY`), which depends on the policies built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PolicyKind {
    /// Threads in turn.
    RoundRobin,
    /// By key, modulo the threads.
    Affinity,
    /// By a hash of the key.
    Hash,
    /// By key; idle threads steal.
    WorkStealing,
    /// One queue every thread takes from.
    Shared,
    /// By key, switching to stealing on imbalance.
    Adaptive,
}

/// A policy that cannot be used: no built-in policy has the name, or the
/// build left it out (see the `policy-*` cargo features of this crate).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PolicyError {
    /// No built-in policy has the name.
    Unknown,
    /// The build leaves the policy out.
    NotBuilt(PolicyKind),
}

/// The old name of [`PolicyError`].
pub type UnknownPolicy = PolicyError;

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PolicyError::Unknown => f.write_str("unknown dispatch policy")?,
            PolicyError::NotBuilt(kind) => write!(
                f,
                "dispatch policy {name} is not in this build (cargo feature `policy-{name}` of device-runtime)",
                name = kind.name()
            )?,
        }
        f.write_str("; this build supports: ")?;
        let built = PolicyKind::ALL.into_iter().filter(|k| k.is_built());
        for (i, kind) in built.enumerate() {
            let sep = if i == 0 { "" } else { ", " };
            write!(f, "{sep}{}", kind.name())?;
        }
        Ok(())
    }
}

impl PolicyKind {
    /// Every built-in policy, in code order.
    pub const ALL: [PolicyKind; 6] = [
        PolicyKind::RoundRobin,
        PolicyKind::Affinity,
        PolicyKind::Hash,
        PolicyKind::WorkStealing,
        PolicyKind::Shared,
        PolicyKind::Adaptive,
    ];

    /// Its number: its index in [`PolicyKind::ALL`].
    pub const fn code(self) -> u8 {
        self as u8
    }

    /// Whether the policy places tasks by their dispatch key (affinity,
    /// hash, work stealing and adaptive do; round-robin and the shared
    /// queue place without one, so a run does not compute or check it).
    pub const fn uses_key(self) -> bool {
        !matches!(self, PolicyKind::RoundRobin | PolicyKind::Shared)
    }

    /// Its name, as `wsp run --policy` and the launch block spell it.
    pub const fn name(self) -> &'static str {
        match self {
            PolicyKind::RoundRobin => "round-robin",
            PolicyKind::Affinity => "affinity",
            PolicyKind::Hash => "hash",
            PolicyKind::WorkStealing => "work-stealing",
            PolicyKind::Shared => "shared",
            PolicyKind::Adaptive => "adaptive",
        }
    }

    /// Whether this build has the policy (its cargo feature is enabled;
    /// round-robin is always built).
    pub const fn is_built(self) -> bool {
        match self {
            PolicyKind::RoundRobin => true,
            PolicyKind::Affinity => cfg!(feature = "policy-affinity"),
            PolicyKind::Hash => cfg!(feature = "policy-hash"),
            PolicyKind::WorkStealing => cfg!(feature = "policy-work-stealing"),
            PolicyKind::Shared => cfg!(feature = "policy-shared"),
            PolicyKind::Adaptive => cfg!(feature = "policy-adaptive"),
        }
    }

    /// The policy called `name`, if this build has it.
    pub fn parse(name: &str) -> Result<PolicyKind, PolicyError> {
        let kind = PolicyKind::ALL
            .into_iter()
            .find(|k| k.name() == name)
            .ok_or(PolicyError::Unknown)?;
        if !kind.is_built() {
            return Err(PolicyError::NotBuilt(kind));
        }
        Ok(kind)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_schedules_round_trip_and_bad_ones_are_refused() {
        use core::str::FromStr;
        let keys = [
            DispatchKey::TaskIndex,
            DispatchKey::Stream,
            DispatchKey::Loop(3),
            DispatchKey::Scalar(2),
            DispatchKey::Tile { arg: 2, dim: 1 },
        ];
        for key in keys {
            let text = std::format!("{key}");
            assert_eq!(DispatchKey::from_str(&text), Ok(key), "{text}");
            for policy in PolicyKind::ALL {
                let s = Schedule { policy, key };
                assert_eq!(Schedule::decode(s.encode()), Some(s));
            }
        }
        for bad in [
            "",
            "loop",
            "loop:",
            "loop:1:2",
            "tile:1",
            "scalar:256",
            "task:0",
            "gang",
        ] {
            assert_eq!(DispatchKey::from_str(bad), Err(BadKey), "{bad}");
        }
        // Encodings of keys no task can have are refused.
        let bad_loop = Schedule {
            policy: PolicyKind::Hash,
            key: DispatchKey::Loop(200),
        };
        assert_eq!(Schedule::decode(bad_loop.encode()), None);
        assert_eq!(Schedule::decode(0xFF), None, "policy 255");
        assert_eq!(
            Schedule::decode(0x0100_0000),
            None,
            "task key with a parameter"
        );
    }
}
