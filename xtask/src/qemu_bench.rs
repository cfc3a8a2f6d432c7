//! `cargo xtask qemu-bench`: the runtime's overhead per task in the QEMU
//! firmware, as a ratio to a baseline in the same image.
//!
//! The three graphs of the host scheduling bench (`host-tools/benches/
//! scheduling.rs`), built the same way with the table builder at sizes that
//! run in seconds under QEMU: (a) independent tasks, (b) a chain, (c) rounds
//! of a fan-out of [`WIDTH`] tasks and a fan-in. Each runs with the
//! firmware's `empty-kernels` mode (the AICores finish each task at once
//! without calling its kernel), through the firmware's normal entry points
//! (dispatcher and scheduler threads, `drive_leader` / `Scheduler::serve`).
//! The baseline is the firmware's `baseline=N` mode with the graph's task
//! count: CPU 0 issues N tasks to the AICores the graphs' tasks run on (the
//! vector cores: every task is an ADD) through the same mailboxes with
//! launch + poll only (no table, no dependency tracking, no dispatch), the
//! least any runner must spend to get N tasks through them. Both report
//! ticks of the generic timer (CNTVCT_EL0) over the run; the ratio is the
//! graph's ticks per task over the baseline's.
//!
//! By default ([`Clock::Icount`]) QEMU counts emulated instructions as its
//! time, so the figures are the same from run to run whatever the host's
//! load; [`Clock::Host`] measures with the host's clock instead. Either
//! way they measure emulated code: compare ratios, not absolute figures.

use std::path::Path;

use anyhow::{bail, Context, Result};
use host_tools::table::{Arg, TableBuilder};
use wsp_ffi::ArgAccess::{In, Out};
use wsp_ffi::WspKernelId_WSP_KERNEL_ADD as ADD;

use device_runtime::abi::memory_map::TABLE_MAX;

use crate::fw;
use crate::qemu::{launch_block, QemuRun};

/// Tasks of a fan-out round, as in the host bench (16 x 16 tiles).
const WIDTH: u32 = 256;
/// Independent tasks of a full run; the chain has a tenth of them and the
/// fan-out/fan-in rounds about as many (the host bench's proportions).
pub const TASKS: u32 = 50_000;
/// Independent tasks of a smoke run.
pub const SMOKE_TASKS: u32 = 3_000;
/// Time limit of one QEMU run, in seconds.
const RUN_SECS: u64 = 600;

/// One graph: its name, table and task count.
struct Graph {
    name: &'static str,
    table: Vec<u8>,
    tasks: u64,
}

fn add(b: &mut TableBuilder, x: Arg, y: Arg, z: Arg) -> Result<()> {
    b.task(ADD, &[x, y, z], &[])?;
    Ok(())
}

/// (a) `n` tasks reading one tile and each writing its own.
fn independent(n: u32) -> Result<Graph> {
    let mut b = TableBuilder::new();
    let x = b.tensor("x", &[1, 1])?;
    let out = b.tensor("out", &[n.div_ceil(1024), 1024])?;
    let one = |t, access| Arg::tile(t, access, 0, 0, 1, 1);
    for i in 0..n {
        let z = Arg::tile(out, Out, i / 1024, i % 1024, 1, 1);
        add(&mut b, one(x, In), one(x, In), z)?;
    }
    finish("(a) independent", b)
}

/// (b) `n` tasks, each reading what the one before wrote.
fn chain(n: u32) -> Result<Graph> {
    let mut b = TableBuilder::new();
    let t = [b.tensor("a", &[1, 1])?, b.tensor("b", &[1, 1])?];
    let k = b.tensor("k", &[1, 1])?;
    let one = |t, access| Arg::tile(t, access, 0, 0, 1, 1);
    for i in 0..n as usize {
        let (src, dst) = (t[i % 2], t[(i + 1) % 2]);
        add(&mut b, one(src, In), one(k, In), one(dst, Out))?;
    }
    finish("(b) chain", b)
}

/// (c) `rounds` rounds of [`WIDTH`] tasks reading `X[j]` and writing `Y[j]`,
/// then one task reading all of Y and writing all of X.
fn fan(rounds: u32) -> Result<Graph> {
    let mut b = TableBuilder::new();
    let x = b.tensor("x", &[16, 16])?;
    let y = b.tensor("y", &[16, 16])?;
    let k = b.tensor("k", &[16, 16])?;
    for _ in 0..rounds {
        for j in 0..WIDTH {
            let one = |t, access| Arg::tile(t, access, j / 16, j % 16, 1, 1);
            add(&mut b, one(x, In), one(k, In), one(y, Out))?;
        }
        let all = |t, access| Arg::tile(t, access, 0, 0, 16, 16);
        add(&mut b, all(y, In), all(k, In), all(x, Out))?;
    }
    finish("(c) fan-out/fan-in", b)
}

fn finish(name: &'static str, b: TableBuilder) -> Result<Graph> {
    Ok(Graph {
        name,
        table: b.finish()?,
        tasks: b.num_tasks() as u64,
    })
}

/// What the firmware's `bench` line says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Bench {
    tasks: u64,
    ticks: u64,
    freq: u64,
}

impl Bench {
    fn per_task(&self) -> f64 {
        self.ticks as f64 / self.tasks as f64
    }
}

/// The `bench tasks=.. ticks=.. freq=..` line of the firmware's output.
fn parse_bench(stdout: &str) -> Option<Bench> {
    let line = stdout.lines().find_map(|l| l.strip_prefix("bench "))?;
    let field = |key: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))?
            .parse::<u64>()
            .ok()
    };
    Some(Bench {
        tasks: field("tasks")?,
        ticks: field("ticks")?,
        freq: field("freq")?,
    })
}

/// Runs the firmware with `args` (and `table`, if any) and reads its bench
/// line, checking that it ran `tasks` tasks.
fn run(
    clock: Clock,
    firmware: &Path,
    dir: &Path,
    table: Option<&[u8]>,
    args: Vec<String>,
    launch: Option<Vec<u8>>,
    tasks: u64,
) -> Result<Bench> {
    let table = match table {
        Some(bytes) => {
            let path = dir.join("table.bin");
            std::fs::write(&path, bytes).with_context(|| format!("writing {}", path.display()))?;
            Some(path)
        }
        None => None,
    };
    let run = QemuRun {
        table,
        launch,
        args: args.clone(),
        timeout_secs: RUN_SECS,
        icount: clock == Clock::Icount,
        capture: true,
        ..QemuRun::new(firmware)
    };
    let outcome = run.run()?;
    let what = format!("the firmware with {}", args.join(" "));
    if !outcome.success() || !outcome.stdout.contains("RESULT OK") {
        bail!(
            "{what} failed (status {}):\n{}{}",
            outcome.status,
            outcome.stdout,
            outcome.stderr
        );
    }
    let bench = parse_bench(&outcome.stdout)
        .with_context(|| format!("{what} printed no bench line:\n{}", outcome.stdout))?;
    if bench.tasks != tasks || bench.freq == 0 {
        bail!("{what}: expected {tasks} tasks: {}", outcome.stdout);
    }
    Ok(bench)
}

/// What the firmware's timer counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Clock {
    /// Emulated instructions: QEMU runs the CPUs one at a time, switching
    /// at the firmware's spin hints, and its virtual clock advances 1 ns
    /// per instruction (`-icount shift=0`), so a run takes the same ticks
    /// whatever the host's load. Ticks per task count the instructions of
    /// every CPU (the waiting ones' few per turn included), 16 per tick.
    Icount,
    /// The host's clock: each CPU has a host thread (QEMU's default), so
    /// the figures include the host's scheduling of those threads and vary
    /// with its load (much, on a host with fewer free cores than the 5 or
    /// more CPUs a run keeps busy).
    Host,
}

/// Builds the firmware, runs the three graphs with empty kernels and their
/// baselines `samples` times each (alternating, so that a change in the
/// host's load hits both), and prints a table of the least ticks per task
/// and their ratios. `tasks`: independent tasks (the other graphs scale
/// with it); `threads`: scheduler threads.
pub fn qemu_bench(root: &Path, tasks: u32, threads: u32, samples: u32, clock: Clock) -> Result<()> {
    if samples == 0 {
        bail!("--samples 0: at least 1");
    }
    if tasks < 10 * (WIDTH + 1) {
        bail!(
            "--tasks {tasks}: at least {} (a fan-out/fan-in round)",
            10 * (WIDTH + 1)
        );
    }
    let firmware = fw::build(root)?;
    let graphs = [
        independent(tasks)?,
        chain(tasks / 10)?,
        fan((tasks / 10) / (WIDTH + 1))?,
    ];
    if let Some(big) = graphs.iter().find(|g| g.table.len() > TABLE_MAX) {
        bail!(
            "--tasks {tasks}: the table of {} takes {} bytes; the firmware's table window holds {TABLE_MAX}",
            big.name,
            big.table.len()
        );
    }
    let launch = launch_block(&[], threads, "").map_err(|e| anyhow::anyhow!("--threads: {e}"))?;
    let dir = std::env::temp_dir().join(format!("wsp-qemu-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let measured = graphs
        .iter()
        .map(|graph| {
            eprintln!("qemu-bench: {} ({} tasks)", graph.name, graph.tasks);
            let mut ours = Vec::new();
            let mut base = Vec::new();
            for _ in 0..samples {
                ours.push(run(
                    clock,
                    &firmware,
                    &dir,
                    Some(&graph.table),
                    vec!["empty-kernels".into()],
                    Some(launch.clone()),
                    graph.tasks,
                )?);
                base.push(run(
                    clock,
                    &firmware,
                    &dir,
                    None,
                    vec![format!("baseline={}", graph.tasks)],
                    None,
                    graph.tasks,
                )?);
            }
            Ok((Figures::of(&ours), Figures::of(&base)))
        })
        .collect::<Result<Vec<_>>>();
    let _ = std::fs::remove_dir_all(&dir);
    let measured = measured?;
    let freq = measured[0].0.freq;
    let (unit, clock) = match clock {
        Clock::Icount => ("instr", "icount: 1 virtual ns per instruction"),
        Clock::Host => ("ns", "host clock"),
    };
    println!(
        "firmware in QEMU, empty kernels, {threads} scheduler thread(s); timer {freq} Hz \
         (CNTFRQ_EL0), {clock}; least of {samples} sample(s); baseline: launch + poll \
         only, CPU 0 to the vector cores"
    );
    println!(
        "{:<20} {:>6} {:>11} {:>8} {:>11} {:>8} {:>7} {:>11}",
        "graph",
        "tasks",
        "ticks/task",
        format!("{unit}/task"),
        "base ticks",
        format!("base {unit}"),
        "ratio",
        "max/min"
    );
    for (graph, (ours, base)) in graphs.iter().zip(measured) {
        println!(
            "{:<20} {:>6} {:>11.0} {:>8.0} {:>11.0} {:>8.0} {:>7.2} {:>5.1}/{:<5.1}",
            graph.name,
            graph.tasks,
            ours.least,
            ours.ns(ours.least),
            base.least,
            base.ns(base.least),
            ours.least / base.least,
            ours.most / ours.least,
            base.most / base.least,
        );
    }
    println!("(max/min: the spread of ticks/task over the samples, graph/baseline)");
    Ok(())
}

/// Ticks per task over a set of samples.
struct Figures {
    least: f64,
    most: f64,
    freq: u64,
}

impl Figures {
    fn of(samples: &[Bench]) -> Figures {
        let per_task = samples.iter().map(Bench::per_task);
        Figures {
            least: per_task.clone().fold(f64::INFINITY, f64::min),
            most: per_task.fold(0.0, f64::max),
            freq: samples[0].freq,
        }
    }

    /// `ticks` in nanoseconds.
    fn ns(&self, ticks: f64) -> f64 {
        ticks * 1e9 / self.freq as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bench_line_is_read_and_a_missing_field_is_none() {
        let out = "tasks=3 wall_us=1\nbench tasks=3 ticks=120 freq=62500000\nRESULT OK\n";
        assert_eq!(
            parse_bench(out),
            Some(Bench {
                tasks: 3,
                ticks: 120,
                freq: 62_500_000
            })
        );
        assert_eq!(parse_bench("bench tasks=3 freq=1\n"), None);
        assert_eq!(parse_bench("tasks=3 ticks=1 freq=1\n"), None);
    }

    #[test]
    fn the_graphs_have_the_host_benchs_task_counts() {
        assert_eq!(independent(100).unwrap().tasks, 100);
        assert_eq!(chain(50).unwrap().tasks, 50);
        assert_eq!(fan(3).unwrap().tasks, 3 * (u64::from(WIDTH) + 1));
    }
}
