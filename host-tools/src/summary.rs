//! A run's figures: as tables for people (`wsp run`: per scheduler thread,
//! per core and per stall reason) and as JSON for scripts (`wsp run
//! --json`), the same figures in both.

use comfy_table::presets::ASCII_MARKDOWN;
use comfy_table::{CellAlignment, Table};
use device_runtime::orch::StallReason;
use device_runtime::sched::RunStats;
use serde_json::{json, Value};

use crate::workloads::Verification;

/// The run's figures: tasks, time (semantic cycles, or platform ticks
/// and microseconds; `ticks_per_second` and `wall_micros` are null in
/// semantic time), policy, window, per thread, per core and per stall
/// reason.
pub fn run_json(stats: &RunStats, semantic: bool) -> Value {
    let threads: Vec<Value> = stats
        .threads()
        .iter()
        .map(|t| {
            json!({
                "thread": t.thread,
                "placed": t.placed,
                "released": t.released,
                "issued": t.issued,
                "from_shared": t.from_shared,
                "queued_behind_running": t.queued,
                "steal_attempts": t.steal_attempts,
                "steals": t.steals,
                "queue_high_water": t.queue_high_water,
                "busy_ticks": t.busy_ticks,
            })
        })
        .collect();
    let cores: Vec<Value> = stats
        .cores()
        .iter()
        .map(|c| {
            json!({
                "core": c.core,
                "kind": format!("{:?}", c.kind),
                "thread": c.thread,
                "tasks": c.tasks,
                "cycles": c.cycles,
                "busy_ticks": c.busy_ticks,
                "idle_ticks": stats.wall_ticks.saturating_sub(c.busy_ticks),
            })
        })
        .collect();
    let stalls: serde_json::Map<String, Value> = StallReason::ALL
        .iter()
        .map(|&r| {
            let s = stats.stalls.of(r);
            let figures = json!({
                "stalls": s.stalls,
                "stall_ticks": s.stall_ticks,
                "high_water": s.high_water,
                "capacity": s.capacity,
            });
            (r.name().to_string(), figures)
        })
        .collect();
    json!({
        "tasks": stats.tasks,
        "clock": if semantic { "cycles" } else { "ticks" },
        "ticks": stats.wall_ticks,
        // A semantic run's clock counts the kernels' cycles: it has no
        // rate and no wall time.
        "ticks_per_second": (!semantic).then_some(stats.ticks_per_second),
        "wall_micros": (!semantic).then(|| stats.wall_micros()),
        "total_cycles": stats.total_cycles(),
        "policy": stats.policy,
        "window": stats.window,
        "threads": threads,
        "cores": cores,
        "stalls": stalls,
        "heap": heap_figures(stats).map(|h| json!({
            "capacity": h.capacity,
            "high_water": h.high_water,
            "stalls": h.stalls,
            "scratch_bytes": h.scratch_bytes,
            "arena_saved": h.arena_saved,
        })),
    })
}

/// The heap ring's figures of a run with scratch tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeapFigures {
    /// The ring's bytes.
    pub capacity: u64,
    /// The most bytes it held at once.
    pub high_water: u64,
    /// Submissions that waited for room (`HEAP_RING_FULL`).
    pub stalls: u64,
    /// What the run's scratch scopes would take as arena tensors of their
    /// own (64-byte aligned; a tensor reused after its `FREE` once per
    /// scope: `RunStats::scratch_bytes`).
    pub scratch_bytes: u64,
    /// Arena bytes saved: `scratch_bytes - capacity` (negative if the ring
    /// is larger than the tensors it holds).
    pub arena_saved: i64,
}

/// The heap ring's figures, if the run's table has scratch tensors.
pub fn heap_figures(stats: &RunStats) -> Option<HeapFigures> {
    if stats.scratch_bytes == 0 {
        return None;
    }
    let r = stats.stalls.of(StallReason::HeapRingFull);
    Some(HeapFigures {
        capacity: r.capacity,
        high_water: r.high_water,
        stalls: r.stalls,
        scratch_bytes: stats.scratch_bytes,
        arena_saved: stats.scratch_bytes as i64 - r.capacity as i64,
    })
}

/// One check against the f64 reference.
pub fn check_json(v: &Verification) -> Value {
    json!({
        "output": v.output,
        "elements": v.elements,
        "max_abs_err": v.max_abs_err,
        "max_rel_err": v.max_rel_err,
        "worst_error_over_bound": v.worst_error_over_bound,
        "tolerance": v.tolerance,
        "passed": v.passed(),
    })
}

/// A table with `header`, the columns after the first `text` ones (the
/// numbers) right aligned, in Markdown's plain ASCII form (it reads in a
/// terminal, a log and a pasted issue alike).
fn table(header: &[&str], text: usize, rows: Vec<Vec<String>>) -> Table {
    let mut t = Table::new();
    t.load_style(ASCII_MARKDOWN).set_header(header.to_vec());
    for row in rows {
        t.add_row(row);
    }
    for column in t.column_iter_mut().skip(text) {
        column.set_cell_alignment(CellAlignment::Right);
    }
    t
}

/// How the tables show a run's times.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeUnit {
    /// Semantic cycles, as the run counted them.
    Cycles,
    /// Nanoseconds, from the platform's ticks at the run's
    /// `ticks_per_second` (the shim's ticks are its host's counter ticks).
    Nanos,
}

impl TimeUnit {
    /// Cycles for a semantic run, else nanoseconds.
    pub fn of_run(semantic: bool) -> Self {
        if semantic {
            TimeUnit::Cycles
        } else {
            TimeUnit::Nanos
        }
    }

    /// Its name in a column's header.
    pub fn name(self) -> &'static str {
        match self {
            TimeUnit::Cycles => "cycles",
            TimeUnit::Nanos => "ns",
        }
    }

    /// `ticks` of `stats`'s run in this unit.
    pub fn of(self, stats: &RunStats, ticks: u64) -> u64 {
        match self {
            TimeUnit::Cycles => ticks,
            TimeUnit::Nanos => {
                let tps = stats.ticks_per_second.max(1) as u128;
                (ticks as u128 * 1_000_000_000 / tps) as u64
            }
        }
    }
}

/// Per scheduler thread: tasks placed on it, released and issued by it,
/// steals, its queue's high-water mark and its cores' busy time.
pub fn threads_table(stats: &RunStats, unit: TimeUnit) -> Table {
    let rows = stats
        .threads()
        .iter()
        .map(|t| {
            vec![
                t.thread.to_string(),
                t.placed.to_string(),
                t.released.to_string(),
                t.issued.to_string(),
                t.from_shared.to_string(),
                t.queued.to_string(),
                format!("{}/{}", t.steals, t.steal_attempts),
                t.queue_high_water.to_string(),
                unit.of(stats, t.busy_ticks).to_string(),
            ]
        })
        .collect();
    let busy = format!("cores busy ({})", unit.name());
    let header = [
        "thread",
        "placed",
        "released",
        "issued",
        "from shared",
        "queued behind",
        "steals/tried",
        "queue high-water",
        busy.as_str(),
    ];
    table(&header, 1, rows)
}

/// Per core: its kind and thread, tasks, kernel cycles, busy and idle
/// time and the busy share of the run.
pub fn cores_table(stats: &RunStats, unit: TimeUnit) -> Table {
    let wall = stats.wall_ticks;
    let rows = stats
        .cores()
        .iter()
        .map(|c| {
            let share = c.busy_ticks as f64 * 100.0 / wall.max(1) as f64;
            vec![
                c.core.to_string(),
                format!("{:?}", c.kind),
                c.thread.to_string(),
                c.tasks.to_string(),
                c.cycles.to_string(),
                unit.of(stats, c.busy_ticks).to_string(),
                unit.of(stats, wall.saturating_sub(c.busy_ticks))
                    .to_string(),
                format!("{share:.1}%"),
            ]
        })
        .collect();
    let (busy, idle) = (
        format!("busy ({})", unit.name()),
        format!("idle ({})", unit.name()),
    );
    let header = [
        "core",
        "kind",
        "thread",
        "tasks",
        "cycles",
        busy.as_str(),
        idle.as_str(),
        "busy",
    ];
    table(&header, 2, rows)
}

/// Per stall reason: stalls, time stalled, high-water mark and capacity;
/// a resource the run does not have (capacity 0) and the channel reasons
/// only where they were used.
pub fn stalls_table(stats: &RunStats, unit: TimeUnit) -> Table {
    let rows = StallReason::ALL
        .iter()
        .filter(|&&r| {
            let s = stats.stalls.of(r);
            let channel = matches!(r, StallReason::ChannelFull | StallReason::ChannelEmpty);
            let used = s.stalls > 0 || s.high_water > 0;
            used || (!channel && s.capacity > 0)
        })
        .map(|&r| {
            let s = stats.stalls.of(r);
            vec![
                r.name().to_string(),
                s.stalls.to_string(),
                unit.of(stats, s.stall_ticks).to_string(),
                s.high_water.to_string(),
                s.capacity.to_string(),
            ]
        })
        .collect();
    let stalled = format!("stalled ({})", unit.name());
    let header = [
        "stall reason",
        "stalls",
        stalled.as_str(),
        "high water",
        "capacity",
    ];
    table(&header, 1, rows)
}
