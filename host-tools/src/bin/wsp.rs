//! `wsp`: build, run, verify and inspect pto-wsp workloads.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use device_runtime::abi::launch::Symbols;
use device_runtime::fault::Fault;
use device_runtime::sched::{ConfigError, DispatchKey, PolicyKind, SchedConfig};
use device_runtime::sched::{RunError, RunOptions, RunStats};
use host_tools::inspect::inspect_checked;
use host_tools::pinning::Placement;
use host_tools::plot::Swimlanes;
use host_tools::program::CspNames;
use host_tools::record::Sink;
use host_tools::semantic::{run_semantic_observed, run_semantic_with};
use host_tools::shim::{Shim, ShimError};
use host_tools::table::Arena;
use host_tools::task_count::{TaskCount, MAX_SHIM_TASKS};
use host_tools::trace::TraceOptions;
use host_tools::workload_file::{FileWorkload, WorkloadFile};
use host_tools::workloads::{sizes_read, Params, Verification, Workload, NAMES};

/// Set by `--json`: the human-readable lines are not printed, the run's
/// figures are printed as one JSON object instead.
static JSON: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// `println!`, unless `--json` asked for JSON alone on standard output.
macro_rules! say {
    ($($arg:tt)*) => {
        if !JSON.load(std::sync::atomic::Ordering::Relaxed) {
            println!($($arg)*);
        }
    };
}

#[derive(Parser)]
#[command(name = "wsp", about = "Build, run and inspect pto-wsp workloads")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// Parsed once per process: the size of its largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Build a workload, run it on the host shim and check it against the
    /// f64 reference; or run a built table (TABLE.bin) on the shim unchanged.
    Run {
        #[command(flatten)]
        workload: WorkloadArgs,
        /// A table's initial data arena (default: zeroes of the table's arena size).
        #[arg(long)]
        arena: Option<PathBuf>,
        /// Where to write the data arena after the run.
        #[arg(long)]
        out: Option<PathBuf>,
        /// A table's program symbols, bound at launch by position (e.g.
        /// `--symbols 3,7`). Symbols that make the program expand to more
        /// than 2^22 tasks are refused; a run whose data decides more ends
        /// with an error at 2^22.
        #[arg(long = "symbols", value_delimiter = ',', allow_negative_numbers = true)]
        table_symbols: Option<Vec<i64>>,
        /// Emulated cube cores (matrix kernels).
        #[arg(long, default_value_t = 2)]
        cube: usize,
        /// Emulated vector cores (the other kernels).
        #[arg(long, default_value_t = 2)]
        vector: usize,
        /// Run in deterministic semantic time on one thread: kernels' cycle
        /// counts drive a virtual clock, and the run reports its makespan.
        #[arg(long)]
        semantic: bool,
        /// Write a Chrome trace-event JSON file of the run (open it in
        /// Perfetto's UI or chrome://tracing): a lane per scheduler thread
        /// (with the dispatcher's stalls) and per AICore (a complete event
        /// per task), counters of tasks on cores, ready and in the window.
        /// Clock: cycles in semantic time, else wall time. An existing
        /// file is replaced; a path whose directory does not exist is
        /// refused before the run.
        #[arg(long, value_name = "FILE")]
        trace: Option<PathBuf>,
        /// With --trace: flow arrows from each task to the tasks it
        /// released (bigger files).
        #[arg(long, requires = "trace")]
        flows: bool,
        /// Draw the run's swimlanes and core utilisation into a PNG file
        /// (FILE ends in .png; an existing file is replaced).
        #[arg(long, value_name = "FILE")]
        plot: Option<PathBuf>,
        /// Print the run's figures (tasks, time, per thread, per core, per
        /// stall reason, the checks) as one JSON object instead of text.
        #[arg(long)]
        json: bool,
        /// Scheduler threads (1 to 4); core c belongs to thread c % threads.
        /// The default is every runner's (QEMU's too): 2.
        #[arg(long, default_value_t = SchedConfig::default().threads)]
        threads: usize,
        /// Pin the scheduler threads one to a processor (Linux; refused when
        /// this process may use fewer processors than --threads): a run
        /// then does not depend on where the OS puts a new thread.
        #[arg(long)]
        pin: bool,
        /// Dispatch policy: round-robin, affinity, hash, work-stealing, shared,
        /// adaptive. The default is every runner's (QEMU's too).
        #[arg(long, default_value = SchedConfig::default().policy.name())]
        policy: String,
        /// Dispatch key of the key-based policies (affinity, hash,
        /// work-stealing, adaptive): `task` (task index), `scalar:N` (scalar
        /// N), `tile:ARG:DIM` (tile index of argument ARG along dimension
        /// DIM, e.g. tile:2:0 = output row block of a GEMM), `stream` (the
        /// task's stream, 0 for a task on none) or `loop:N` (the index of
        /// the program loop at nesting level N around the task; task
        /// records have none). Every task must have what the
        /// key names, else the run is refused. Default: `task`, the one key
        /// every task has.
        #[arg(long)]
        key: Option<String>,
        /// Tasks one dispatch queue may hold (1 to 256).
        #[arg(long, default_value_t = device_runtime::sched::DISPATCH_QUEUE)]
        queue_depth: usize,
        /// Tasks handed to one core at once: 1 (idle cores only) or 2 (also
        /// queue the next task behind a running one, as the device's double
        /// buffered handshake does). Default: 2.
        #[arg(long)]
        issue_depth: Option<usize>,
        /// Task window: at most this many tasks submitted and not retired
        /// (1 to 4096). Default: the workload program's, else 4096.
        #[arg(long)]
        window: Option<usize>,
        /// Inject one fault to see how the run ends (not in semantic time):
        /// `no-ack:CORE:TASK` (the core never takes the task),
        /// `no-fin:CORE:TASK` (it never finishes it), `error:CORE:TASK:CODE`
        /// (its kernel reports error CODE) or `no-kernel:CORE:KERNEL` (the
        /// kernel is not built into the core). CORE is the run-wide core
        /// number; TASK is N (the core's Nth task, from 1) or kK (its first
        /// task of kernel id K).
        #[arg(long, value_parser = parse_fault)]
        fault: Option<Fault>,
        /// How long a task may run before the run ends with an error (at
        /// least 1). In semantic time it is measured in semantic cycles
        /// (10^6 a millisecond): a kernel whose cycles exceed it ends the
        /// run.
        #[arg(long, default_value_t = RunOptions::default().kernel_timeout_ms)]
        kernel_timeout_ms: u64,
        /// How long a core may leave a task unacknowledged before the run
        /// ends with an error (at least 1; default: 1000). Not in semantic
        /// time, where a core takes its task the moment it is issued.
        #[arg(long)]
        ack_timeout_ms: Option<u64>,
    },
    /// Draw a trace written by `wsp run --trace` as a PNG: swimlanes (one
    /// row per scheduler thread and core, tasks coloured by kernel, stalls
    /// in red) and core utilisation over time.
    Plot {
        /// The trace (JSON).
        trace: PathBuf,
        /// The PNG file to write.
        #[arg(long)]
        out: PathBuf,
    },
    /// Write a workload's table.bin and initial arena.bin (e.g. for `cargo xtask qemu`).
    Build {
        #[command(flatten)]
        workload: WorkloadArgs,
        #[arg(long)]
        out: PathBuf,
    },
    /// Check an arena produced by another runner (QEMU) against the reference.
    Verify {
        #[command(flatten)]
        workload: WorkloadArgs,
        #[arg(long)]
        arena: PathBuf,
    },
    /// Print a table (table.bin, or a workload file's) in readable form,
    /// with its validation result; a program the host can expand (its
    /// symbols given) is checked task by task as a run checks it.
    Inspect {
        /// A table (a path ending in .bin, or a file that starts with the
        /// table magic), or a workload file (a path ending in .toml, or
        /// another existing file).
        table: PathBuf,
        /// Show every task, not only the first ones.
        #[arg(long)]
        all: bool,
        /// A workload file's symbol value, NAME=VALUE (repeatable).
        #[arg(long = "symbol", value_name = "NAME=VALUE")]
        symbols: Vec<String>,
        /// A table's program symbols by position (e.g. `--symbols 3,7`), to
        /// count its tasks with.
        #[arg(long = "symbols", value_delimiter = ',', allow_negative_numbers = true)]
        table_symbols: Option<Vec<i64>>,
    },
}

#[derive(Args)]
struct WorkloadArgs {
    /// A built-in workload (gemm, mlp, mlp-scratch, streams, moe, moe-var, pipeline,
    /// attention-pipeline, decode, decode-uniform, decode-skew,
    /// decode-device, sparse-decode, moe-layer, moe-layer-var,
    /// decode-layer, decode-layer-dense, stitched; the earlier
    /// implementation's examples wsp9-validated-matmul, wsp9-tensor-data-add,
    /// wsp9-tensor-data-square, wsp9-attention, wsp9-bgemm, wsp9-softmax,
    /// wsp9-csp-pipeline, wsp9-lightning-indexer, at fixed sizes), a
    /// workload file (a path ending in .toml, or another existing file that
    /// is not a table), or, for `wsp
    /// run` only, a built table (a path ending in .bin, or a file that
    /// starts with the table magic).
    workload: String,
    /// A workload file's symbol value, NAME=VALUE (repeatable); unset
    /// symbols take the file's defaults.
    #[arg(long = "symbol", value_name = "NAME=VALUE")]
    symbols: Vec<String>,
    /// A built-in workload's size m (default: the workload's own). Sizes
    /// whose tensors would take more than 1 GiB, or which would run more
    /// than 2^20 tasks, are refused before anything is built; so is a size
    /// the workload does not read (attention-pipeline's k and tile, moe's
    /// tile, any of v9's examples').
    #[arg(long)]
    m: Option<u32>,
    /// A built-in workload's size n (default: the workload's own).
    #[arg(long)]
    n: Option<u32>,
    /// A built-in workload's size k (default: the workload's own).
    #[arg(long)]
    k: Option<u32>,
    /// A tiled built-in workload's tile size (default: the workload's own;
    /// 32 for gemm, mlp and streams).
    #[arg(long)]
    tile: Option<u32>,
    /// A built-in workload's data seed: changes the data, never the sizes (default: 1).
    #[arg(long)]
    seed: Option<u64>,
    /// The pipeline workloads' channel depth (pipeline,
    /// attention-pipeline): tokens each channel holds, 0 (a rendezvous) to
    /// 16 (default: 2).
    #[arg(long)]
    depth: Option<u32>,
    /// The decode-layer workloads' layer count (decode-layer,
    /// decode-layer-dense; default: 2). Each layer has weights of its own;
    /// the step's program grows by a layer's instructions, and its sizes
    /// count against the 1 GiB and 2^20-task bounds.
    #[arg(long)]
    layers: Option<u32>,
}

/// A built-in workload or a workload file's.
enum Loaded {
    Named(Workload),
    File(Box<FileWorkload>),
}

impl Loaded {
    fn name(&self) -> &str {
        match self {
            Loaded::Named(w) => w.name,
            Loaded::File(f) => &f.name,
        }
    }
    fn summary(&self) -> &str {
        match self {
            Loaded::Named(w) => &w.summary,
            Loaded::File(f) => &f.summary,
        }
    }
    /// The names of its channels and processes.
    fn csp_names(&self) -> CspNames {
        match self {
            Loaded::Named(w) => w.csp.clone(),
            Loaded::File(f) => f.program().csp_names(),
        }
    }

    fn table(&self) -> &[u8] {
        match self {
            Loaded::Named(w) => &w.table,
            Loaded::File(f) => &f.table,
        }
    }
    fn arena(&self) -> &Arena {
        match self {
            Loaded::Named(w) => &w.arena,
            Loaded::File(f) => &f.arena,
        }
    }
    fn tasks(&self) -> usize {
        match self {
            Loaded::Named(w) => w.tasks,
            Loaded::File(f) => f.tasks.len(),
        }
    }
    fn symbols(&self) -> &[i64] {
        match self {
            Loaded::Named(_) => &[],
            Loaded::File(f) => &f.symbols,
        }
    }
    /// `symbols  m = 4, ...` for a file with symbols.
    fn symbols_line(&self) -> Option<String> {
        match self {
            Loaded::File(f) if !f.symbols.is_empty() => Some(
                f.symbol_names
                    .iter()
                    .zip(&f.symbols)
                    .map(|(n, v)| format!("{n} = {v}"))
                    .collect::<Vec<_>>()
                    .join(", "),
            ),
            _ => None,
        }
    }
}

/// What a workload argument names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Input {
    /// A built-in workload (or an unknown name: building it says so).
    Named,
    /// A workload file.
    File,
    /// A built table.bin.
    Table,
}

/// Whether the file at `path` starts with the table magic.
fn starts_with_magic(path: &Path) -> bool {
    use std::io::Read;
    let mut head = [0u8; 8];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut head))
        .is_ok_and(|()| head == device_runtime::abi::MAGIC)
}

/// What a path names, for every command that takes a file: one ending in
/// `.toml` is a workload file; one ending in `.bin`, or an existing file
/// that starts with the table magic, a table; any other existing file a
/// workload file. `None`: no such file.
fn classify_path(path: &Path) -> Option<Input> {
    let name = path.to_string_lossy();
    if name.ends_with(".toml") {
        Some(Input::File)
    } else if name.ends_with(".bin") || starts_with_magic(path) {
        Some(Input::Table)
    } else if path.is_file() {
        Some(Input::File)
    } else {
        None
    }
}

/// A built-in name is a workload; otherwise a path as [`classify_path`]
/// says, and a name that is no file a workload too (building it says
/// whether there is one).
fn classify(arg: &str) -> Input {
    if NAMES.contains(&arg) {
        Input::Named
    } else {
        classify_path(Path::new(arg)).unwrap_or(Input::Named)
    }
}

/// `NAME=VALUE` arguments; a name given twice is refused (which value
/// would count is not for `wsp` to guess).
fn parse_symbols(args: &[String]) -> Result<Vec<(String, i64)>> {
    let mut bound: Vec<(String, i64)> = Vec::with_capacity(args.len());
    for a in args {
        let (name, value) = a
            .split_once('=')
            .with_context(|| format!("--symbol {a}: expected NAME=VALUE"))?;
        let value = value
            .trim()
            .parse()
            .with_context(|| format!("--symbol {a}: {value} is not an integer"))?;
        let name = name.trim().to_string();
        if let Some((_, first)) = bound.iter().find(|(n, _)| *n == name) {
            bail!("--symbol {name} is given twice ({name}={first} and {a}); give it once");
        }
        bound.push((name, value));
    }
    Ok(bound)
}

/// `--symbols` binds exactly the symbols the table's program reads, by
/// position: fewer or more is refused, saying how many.
fn check_symbol_count(table: &device_runtime::abi::Table<'_>, symbols: &[i64]) -> Result<()> {
    let reads = table.program_info().symbols;
    if symbols.len() != reads {
        let how = match reads {
            0 => "leave out --symbols".to_string(),
            1 => "bind symbol 0: --symbols V0".to_string(),
            _ => format!(
                "bind symbols 0 to {} by position: --symbols V0,V1,...",
                reads - 1
            ),
        };
        bail!(
            "--symbols: {} given; the table's program reads {reads} ({how})",
            symbols.len(),
        );
    }
    Ok(())
}

fn load_file(path: &str, symbols: &[String]) -> Result<FileWorkload> {
    let symbols = parse_symbols(symbols)?;
    let file = WorkloadFile::load(Path::new(path)).map_err(|e| anyhow::anyhow!("{path}: {e}"))?;
    file.build(&symbols)
        .map_err(|e| anyhow::anyhow!("{path}: {e}"))
}

impl WorkloadArgs {
    fn sizes_given(&self) -> bool {
        self.m
            .or(self.n)
            .or(self.k)
            .or(self.tile)
            .or(self.depth)
            .or(self.layers)
            .is_some()
    }

    /// The built-in workload or workload file named; `command` is the
    /// subcommand, for the message when it names a table.
    fn load(&self, command: &str) -> Result<Loaded> {
        match classify(&self.workload) {
            Input::Table => bail!(
                "{}: wsp {command} takes a built-in workload or a workload file, not a table \
                 (`wsp run TABLE.bin` runs a table, `wsp inspect TABLE.bin` shows it)",
                self.workload
            ),
            Input::Named => {
                if !NAMES.contains(&self.workload.as_str()) && Path::new(&self.workload).is_dir() {
                    bail!(
                        "{}: a directory, not a workload (`wsp build W --out DIR` writes DIR/table.bin and DIR/arena.bin; `wsp run DIR/table.bin --arena DIR/arena.bin` runs them)",
                        self.workload
                    );
                }
                if !self.symbols.is_empty() {
                    bail!("--symbol applies to workload files, not to built-in workloads");
                }
                Ok(Loaded::Named(self.build()?))
            }
            Input::File => {
                if self.sizes_given() || self.seed.is_some() {
                    bail!("--m, --n, --k, --tile, --depth, --layers and --seed apply to built-in workloads; a workload file gives its own sizes and data");
                }
                Ok(Loaded::File(Box::new(load_file(
                    &self.workload,
                    &self.symbols,
                )?)))
            }
        }
    }

    /// The built-in workload: its own default sizes, except those given.
    fn build(&self) -> Result<Workload> {
        let d = Params::of(&self.workload).map_err(|e| {
            anyhow::anyhow!("{e}; nor is it a workload file (FILE.toml) or a table (TABLE.bin)")
        })?;
        let (read, why) = sizes_read(&self.workload);
        let unread: Vec<String> = [
            ("m", self.m),
            ("n", self.n),
            ("k", self.k),
            ("tile", self.tile),
        ]
        .iter()
        .filter(|(size, given)| given.is_some() && !read.contains(size))
        .map(|(size, _)| format!("--{size}"))
        .collect();
        if !unread.is_empty() {
            let them = if unread.len() == 1 { "it" } else { "them" };
            bail!(
                "{}: {} does not take {them} ({why})",
                unread.join(", "),
                self.workload
            );
        }
        let p = Params {
            m: self.m.unwrap_or(d.m),
            n: self.n.unwrap_or(d.n),
            k: self.k.unwrap_or(d.k),
            tile: self.tile.unwrap_or(d.tile),
            seed: self.seed.unwrap_or(d.seed),
        };
        if let Some(layers) = self.layers {
            if self.depth.is_some() {
                bail!("--depth applies to the pipeline and attention-pipeline workloads");
            }
            return Workload::decode_layers(&self.workload, p, layers)
                .with_context(|| format!("building workload {}", self.workload));
        }
        let built = match self.depth {
            Some(depth) if self.workload == "pipeline" => host_tools::budget::check("pipeline", &p)
                .and_then(|()| host_tools::pipeline::pipeline(p, depth).map(|(w, _)| w)),
            Some(depth) if self.workload == "attention-pipeline" => {
                host_tools::budget::check("attention-pipeline", &p).and_then(|()| {
                    host_tools::attention_pipeline::attention_pipeline(p, depth).map(|(w, _)| w)
                })
            }
            Some(_) => bail!("--depth applies to the pipeline and attention-pipeline workloads"),
            None => Workload::build(&self.workload, p),
        };
        built.with_context(|| format!("building workload {}", self.workload))
    }

    /// Refuses the flags that do not apply to a table.
    fn check_table_flags(&self) -> Result<()> {
        if self.sizes_given() || self.seed.is_some() {
            bail!("--m, --n, --k, --tile, --depth, --layers and --seed apply to built-in workloads; a table has its sizes and data built in");
        }
        if !self.symbols.is_empty() {
            bail!("--symbol NAME=VALUE applies to workload files; bind a table's symbols by position: --symbols V0,V1,...");
        }
        Ok(())
    }
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// `task`, `scalar:N`, `tile:ARG:DIM`, `stream` or `loop:N`.
fn parse_key(text: &str) -> Result<DispatchKey> {
    text.parse()
        .map_err(|e| anyhow::anyhow!("--key {text}: {e}"))
}

/// The shim's machine and scheduling for one `wsp run`.
struct RunSetup {
    shim: Shim,
    semantic: bool,
    /// Where to write the run's trace.
    trace: Option<PathBuf>,
    /// Flow arrows in the trace.
    flows: bool,
    /// Where to draw the run's picture.
    plot: Option<PathBuf>,
    /// Whether a progress bar may show (not under --json).
    progress: bool,
    /// Tasks the run will run, if known (for the progress bar).
    total: Option<u64>,
    /// A fault to inject (`--fault`).
    fault: Option<Fault>,
}

/// `--fault`'s value.
fn parse_fault(text: &str) -> Result<Fault, String> {
    Fault::parse(text).map_err(|e| e.to_string())
}

impl RunSetup {
    /// Runs `table` on `arena` and prints the run's figures.
    fn run(&self, table: &[u8], arena: &mut [u8]) -> Result<RunStats> {
        let (shim, sched) = (&self.shim, &self.shim.sched);
        let (threads, cube, vector) = (sched.threads, shim.cube_cores, shim.vector_cores);
        // Checked before the run, not after it.
        if let Some(path) = &self.trace {
            check_output(path, "--trace", false)?;
        }
        if let Some(path) = &self.plot {
            check_output(path, "--plot", true)?;
        }
        let record = self.trace.is_some() || self.plot.is_some();
        let progress = self.progress && host_tools::progress::wanted();
        // Observed only when asked: an untraced run's platform reports nothing.
        let sink = (record || progress).then(|| Sink::new(record));
        let observed = |run: &mut dyn FnMut(Option<&Sink>) -> Result<RunStats>| match &sink {
            Some(sink) if progress => {
                host_tools::progress::with_progress(sink, self.total, || run(Some(sink)))
            }
            sink => run(sink.as_ref()),
        };
        shim.check_cores()?;
        let kinds = shim.core_kinds();
        let stats = if self.semantic {
            say!(
                "shim      semantic time on one host thread: {threads} scheduler threads ({}), {cube} cube + {vector} vector AICores",
                sched.policy.name()
            );
            let mut makespan = 0;
            let stats = observed(&mut |sink| {
                let run = match sink {
                    Some(sink) => {
                        run_semantic_observed(table, arena, &kinds, sched, &shim.options, sink)?
                    }
                    None => run_semantic_with(table, arena, &kinds, sched, &shim.options)?,
                };
                makespan = run.makespan;
                Ok(run.stats)
            })?;
            say!(
                "ran       {} tasks, makespan {makespan} cycles",
                stats.tasks
            );
            stats
        } else {
            say!(
                "shim      {threads} AICPU scheduler threads ({}), {cube} cube + {vector} vector AICore threads",
                sched.policy.name()
            );
            let stats = observed(&mut |sink| {
                Ok(match (sink, self.fault) {
                    (Some(sink), fault) => {
                        shim.run_observed_with_fault(table, arena, sink, fault)?
                    }
                    (None, Some(fault)) => shim.run_with_fault(table, arena, fault)?,
                    (None, None) => shim.run(table, arena)?,
                })
            })?;
            // Every fault that hits ends the run with an error.
            if let Some(fault) = self.fault {
                bail!(
                    "--fault {fault} never hit: core {} ran no such task",
                    fault.core
                );
            }
            say!(
                "ran       {} tasks in {:.3} ms wall",
                stats.tasks,
                stats.wall_micros() as f64 / 1000.0
            );
            stats
        };
        if let (Some(sink), true) = (&sink, record) {
            let core_threads: Vec<usize> = (0..kinds.len())
                .map(|c| device_runtime::sched::core_owner(c, threads))
                .collect();
            let rec = sink.recording(&kinds, &core_threads, stats.ticks_per_second, self.semantic);
            let options = TraceOptions { flows: self.flows };
            let trace = host_tools::trace::chrome_trace(&rec, &options);
            if let Some(path) = &self.trace {
                std::fs::write(path, trace.to_string())
                    .with_context(|| format!("writing the trace to {}", path.display()))?;
                say!(
                    "trace     {} ({} events)",
                    path.display(),
                    trace["traceEvents"].as_array().map_or(0, Vec::len)
                );
            }
            if let Some(path) = &self.plot {
                draw(&trace, path)?;
            }
        }
        print_stats(&stats, self.semantic);
        Ok(stats)
    }
}

/// Refuses an output path (of `flag`) that cannot be written as asked:
/// a directory, a file in a directory that does not exist, or for a
/// picture (`png`) a name not ending in `.png`. Nothing is created: a
/// file the run cannot write for another reason (permissions, a full
/// disk) is still reported when it is written.
fn check_output(path: &Path, flag: &str, png: bool) -> Result<()> {
    if path.is_dir() {
        bail!("{flag} {}: is a directory; name a file", path.display());
    }
    let parent = path.parent().filter(|p| !p.as_os_str().is_empty());
    if let Some(dir) = parent.filter(|d| !d.is_dir()) {
        bail!(
            "{flag} {}: the directory {} does not exist",
            path.display(),
            dir.display()
        );
    }
    let is_png = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("png"));
    if png && !is_png {
        bail!(
            "{flag} {}: the picture is a PNG; name a file ending in .png",
            path.display()
        );
    }
    Ok(())
}

/// Draws `trace` into the PNG file `path`.
fn draw(trace: &serde_json::Value, path: &Path) -> Result<()> {
    let lanes = Swimlanes::from_trace(trace)?;
    lanes
        .draw(path)
        .with_context(|| format!("writing the picture to {}", path.display()))?;
    let g = lanes.geometry();
    say!(
        "plot      {} ({}x{} pixels, {} lanes)",
        path.display(),
        g.width,
        g.height,
        lanes.lanes.len()
    );
    Ok(())
}

/// A channel deadlock report with a line naming the processes and
/// channels it numbers; other errors unchanged.
fn name_deadlock(e: anyhow::Error, names: &CspNames) -> anyhow::Error {
    let legend = match e.downcast_ref::<ShimError>() {
        Some(ShimError::Run(run)) => match &**run {
            RunError::ChannelDeadlock(report) => names.legend(report),
            _ => None,
        },
        _ => None,
    };
    match legend {
        Some(legend) => anyhow::anyhow!("{e:#}\n{legend}"),
        None => e,
    }
}

/// Per-taskset, per-thread and per-core figures, and backpressure.
fn print_stats(stats: &RunStats, semantic: bool) {
    say!("policy    {}", stats.policy);
    for (set, t) in stats.tasksets.iter().enumerate() {
        if let (1.., Some(t)) = (set, t) {
            let key = t.key.map_or("none".to_string(), |k| k.to_string());
            say!(
                "  taskset {set} (the program's): {}, key {key}, placed {} tasks",
                t.decision,
                t.placed
            );
        }
    }
    say!("window    {} tasks in flight at most", stats.window);
    let unit = host_tools::summary::TimeUnit::of_run(semantic);
    say!("{}", host_tools::summary::threads_table(stats, unit));
    say!("{}", host_tools::summary::cores_table(stats, unit));
    say!("total semantic cycles {}", stats.total_cycles());
    say!("{}", host_tools::summary::stalls_table(stats, unit));
    print_heap(stats);
}

/// Writes the arena after a run to `out`, if asked.
fn write_out(out: Option<&Path>, arena: &[u8]) -> Result<()> {
    if let Some(out) = out {
        std::fs::write(out, arena).with_context(|| format!("writing {}", out.display()))?;
        say!(
            "wrote     {} (the arena after the run, {} bytes)",
            out.display(),
            arena.len()
        );
    }
    Ok(())
}

/// Reads a table file. A file is one table: bytes past the header's
/// `total_len` (something appended to it, `cat table.bin x > t.bin`) are
/// refused rather than ignored, as `Table::parse` does for the loaders
/// that hand it a fixed window or a padded buffer. Every other fault,
/// a file cut short included, is left to `Table::parse` (and to
/// `inspect`'s listing of what it can read).
fn read_table_file(path: &Path) -> Result<Vec<u8>> {
    use device_runtime::abi::{exact_table_len, Problem};
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    if let Err(e) = exact_table_len(&bytes) {
        if matches!(e.problem, Problem::TrailingBytes { .. }) {
            bail!("{}: {e}", path.display());
        }
    }
    Ok(bytes)
}

/// `wsp run TABLE.bin`: the table unchanged on the shim, on the arena in
/// `arena` (default zeroes), with `symbols` bound by position.
fn run_table(
    path: &str,
    arena: Option<&Path>,
    symbols: &[i64],
    setup: &mut RunSetup,
    out: Option<&Path>,
) -> Result<bool> {
    let bytes = read_table_file(Path::new(path))?;
    let table =
        device_runtime::abi::Table::parse(&bytes).map_err(|e| anyhow::anyhow!("{path}: {e}"))?;
    let size =
        usize::try_from(table.arena_size()).context("the table's arena does not fit in memory")?;
    let mut data = match arena {
        Some(a) => {
            let data = std::fs::read(a).with_context(|| format!("reading {}", a.display()))?;
            if data.len() != size {
                bail!(
                    "{}: {} bytes; the table's arena is {size} bytes",
                    a.display(),
                    data.len()
                );
            }
            data
        }
        None => {
            // A header may claim any size: too large is an error, not an abort.
            let mut data = Vec::new();
            data.try_reserve_exact(size).map_err(|_| {
                anyhow::anyhow!(
                    "{path}: the table's arena is {size} bytes, more than this host can allocate"
                )
            })?;
            data.resize(size, 0);
            data
        }
    };
    check_symbol_count(&table, symbols)?;
    setup.shim.options.symbols = Symbols::new(symbols).context("--symbols: too many symbols")?;
    // Symbols may ask for billions of tasks: too many is refused before the
    // run (an expansion that fails is left to the run, which names where).
    // Counted with the run's data, once: for the limit, the summary and the
    // progress bar.
    let counted = host_tools::task_count::count_tasks(&table, Some(&data), symbols);
    if let Ok(count) = &counted {
        count.check_shim_limit().map_err(|why| {
            let list: Vec<String> = symbols.iter().map(i64::to_string).collect();
            match symbols {
                [] => anyhow::anyhow!("{path}: {why}"),
                _ => anyhow::anyhow!("{path} with --symbols {}: {why}", list.join(",")),
            }
        })?;
        if let TaskCount::Exact(n) = *count {
            setup.total = u64::try_from(n).ok();
        }
    }
    // A count the host cannot tell before the run (data the run writes
    // decides it, or a range's upper end is past the limit) is bounded
    // during the run: it ends with an error after that many tasks.
    setup.shim.options.max_tasks = Some(MAX_SHIM_TASKS as u64);
    say!(
        "table     {path}: {}",
        host_tools::inspect::summary_with(&table, counted, TaskCount::shim_limit)
    );
    match arena {
        Some(a) => say!("arena     {} ({size} bytes)", a.display()),
        None => say!("arena     {size} bytes of zeroes"),
    }
    if !symbols.is_empty() {
        let list: Vec<String> = symbols.iter().map(i64::to_string).collect();
        say!("symbols   {}", list.join(", "));
    }
    setup.run(&bytes, &mut data)?;
    write_out(out, &data)?;
    say!("no reference for a table: check the arena with `wsp verify WORKLOAD --arena OUT`");
    Ok(true)
}

fn run(cli: Cli) -> Result<bool> {
    match cli.command {
        Command::Run {
            workload,
            arena,
            out,
            table_symbols,
            cube,
            vector,
            semantic,
            trace,
            flows,
            plot,
            json,
            threads,
            pin,
            policy,
            key,
            queue_depth,
            issue_depth,
            window,
            fault,
            kernel_timeout_ms,
            ack_timeout_ms,
        } => {
            if fault.is_some() && semantic {
                bail!("--fault runs on the shim's threads; semantic time has no cores to break");
            }
            if pin && semantic {
                bail!("--pin places the shim's threads; a semantic-time run has no host threads to place");
            }
            if ack_timeout_ms.is_some() && semantic {
                bail!("--ack-timeout-ms: in semantic time a core takes its task the moment it is issued, so there is no acknowledgement to time out (--kernel-timeout-ms applies)");
            }
            JSON.store(json, std::sync::atomic::Ordering::Relaxed);
            let policy = PolicyKind::parse(&policy)
                .map_err(|e| anyhow::anyhow!("--policy {policy}: {e}"))?;
            if key.is_some() && matches!(policy, PolicyKind::RoundRobin | PolicyKind::Shared) {
                bail!(
                    "--key applies to the key-based policies (affinity, hash, work-stealing, adaptive); {} places tasks without one",
                    policy.name()
                );
            }
            let sched = SchedConfig {
                threads,
                policy,
                key: match key.as_deref() {
                    Some(key) => parse_key(key)?,
                    None => SchedConfig::default().key,
                },
                queue_depth,
            };
            let mut setup = RunSetup {
                shim: Shim {
                    cube_cores: cube,
                    vector_cores: vector,
                    sched,
                    options: RunOptions {
                        issue_depth,
                        window,
                        kernel_timeout_ms,
                        ack_timeout_ms: ack_timeout_ms
                            .unwrap_or(RunOptions::default().ack_timeout_ms),
                        ..RunOptions::default()
                    },
                    placement: if pin {
                        Placement::Pinned
                    } else {
                        Placement::Os
                    },
                },
                semantic,
                trace,
                flows,
                plot,
                progress: !json,
                total: None,
                fault,
            };
            // Every run checks its options; checked here first, an error
            // names the flag that set it.
            let options = setup.shim.options;
            options.check().map_err(|e| match e {
                ConfigError::KernelTimeout { ms } => {
                    anyhow::anyhow!("--kernel-timeout-ms {ms}: {e}")
                }
                ConfigError::AckTimeout { ms } => anyhow::anyhow!("--ack-timeout-ms {ms}: {e}"),
                e => anyhow::anyhow!("{e}"),
            })?;
            if classify(&workload.workload) == Input::Table {
                workload.check_table_flags()?;
                return run_table(
                    &workload.workload,
                    arena.as_deref(),
                    table_symbols.as_deref().unwrap_or_default(),
                    &mut setup,
                    out.as_deref(),
                );
            }
            if arena.is_some() {
                bail!("--arena applies to a table (wsp run TABLE.bin); a workload builds its own arena");
            }
            if table_symbols.is_some() {
                bail!("--symbols applies to a table (wsp run TABLE.bin); a workload file takes --symbol NAME=VALUE");
            }
            let w = workload.load("run")?;
            setup.shim.options.symbols = Symbols::new(w.symbols()).context("too many symbols")?;
            say!("workload  {}: {}", w.name(), w.summary());
            if let Some(line) = w.symbols_line() {
                say!("symbols   {line}");
            }
            let parsed =
                device_runtime::abi::Table::parse(w.table()).map_err(|e| anyhow::anyhow!("{e}"))?;
            let plural =
                |n: usize, what: &str| format!("{n} {what}{}", if n == 1 { "" } else { "s" });
            let program = match (parsed.tasks().len(), parsed.program().len()) {
                (_, 0) => String::new(),
                (0, n) => format!(
                    " (a program of {}, expanded on the device)",
                    plural(n, "instruction")
                ),
                (t, n) => format!(
                    " ({} and a program of {}, expanded on the device)",
                    plural(t, "task record"),
                    plural(n, "instruction")
                ),
            };
            say!(
                "table     {} tasks{program}, {} bytes, arena {} bytes",
                w.tasks(),
                w.table().len(),
                w.arena().bytes.len()
            );
            setup.total = Some(w.tasks() as u64);
            let mut arena = w.arena().clone();
            let stats = setup
                .run(w.table(), &mut arena.bytes)
                .map_err(|e| name_deadlock(e, &w.csp_names()))?;
            write_out(out.as_deref(), &arena.bytes)?;
            let (passed, checks) = report(&w, &arena, Some(stats.tasks as usize));
            if json {
                let figures = host_tools::summary::run_json(&stats, semantic);
                let out = serde_json::json!({
                    "workload": w.name(),
                    "run": figures,
                    "checks": checks.iter().map(host_tools::summary::check_json).collect::<Vec<_>>(),
                    "passed": passed,
                });
                println!("{out}");
            }
            Ok(passed)
        }
        Command::Plot { trace, out } => {
            check_output(&out, "--out", true)?;
            let text =
                std::fs::read(&trace).with_context(|| format!("reading {}", trace.display()))?;
            let value: serde_json::Value = serde_json::from_slice(&text)
                .with_context(|| format!("{} is not JSON", trace.display()))?;
            draw(&value, &out).with_context(|| format!("{}", trace.display()))?;
            Ok(true)
        }
        Command::Build { workload, out } => {
            let w = workload.load("build")?;
            std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
            let (table, arena) = (out.join("table.bin"), out.join("arena.bin"));
            std::fs::write(&table, w.table())
                .with_context(|| format!("writing {}", table.display()))?;
            std::fs::write(&arena, &w.arena().bytes)
                .with_context(|| format!("writing {}", arena.display()))?;
            say!(
                "wrote {} ({} tasks) and {} ({} bytes)",
                table.display(),
                w.tasks(),
                arena.display(),
                w.arena().bytes.len()
            );
            if let Some(line) = w.symbols_line() {
                say!("the program's symbols, to bind at launch: {line}");
            }
            Ok(true)
        }
        Command::Verify { workload, arena } => {
            let w = workload.load("verify")?;
            let bytes =
                std::fs::read(&arena).with_context(|| format!("reading {}", arena.display()))?;
            Ok(report(&w, &Arena { bytes }, None).0)
        }
        Command::Inspect {
            table,
            all,
            symbols,
            table_symbols,
        } => {
            let path = table.to_string_lossy().into_owned();
            // Files as `wsp run` tells them apart (a table by its `.bin` or
            // its magic); a built-in name that is no file is pointed at
            // `wsp build`, any other path that is no file read as a table
            // (and reported missing).
            let input = match classify_path(&table) {
                Some(input) => input,
                None if NAMES.contains(&path.as_str()) && !table.exists() => Input::Named,
                None => Input::Table,
            };
            let (bytes, file, bound) = match input {
                Input::Named => bail!(
                    "{path} is a built-in workload: `wsp build {path} --out DIR` writes its table, then `wsp inspect DIR/table.bin`"
                ),
                Input::File => {
                    if table_symbols.is_some() {
                        bail!("--symbols applies to a table; a workload file takes --symbol NAME=VALUE");
                    }
                    let f = load_file(&path, &symbols)?;
                    let bound = f.symbols.clone();
                    (f.table.clone(), Some(f), bound)
                }
                Input::Table => {
                    if !symbols.is_empty() {
                        bail!("--symbol applies to workload files (FILE.toml); bind a table's symbols by position: --symbols V0,V1,...");
                    }
                    let bytes = read_table_file(&table)?;
                    let bound = table_symbols.unwrap_or_default();
                    // Fewer than the program reads leaves the rest to the
                    // count's range; more would be dropped unread. (An
                    // invalid table is inspected for its problems, below.)
                    if let Ok(parsed) = device_runtime::abi::Table::parse(&bytes) {
                        if bound.len() > parsed.program_info().symbols {
                            check_symbol_count(&parsed, &bound)?;
                        }
                    }
                    (bytes, None, bound)
                }
            };
            let names = file
                .as_ref()
                .map(|f| f.program().csp_names())
                .unwrap_or_default();
            let (text, verdict) = inspect_checked(&bytes, all, &bound, &names);
            print!("{text}");
            if let Some(f) = file {
                let w = Loaded::File(Box::new(f));
                let with = w
                    .symbols_line()
                    .map_or(String::new(), |s| format!(" with {s}"));
                say!(
                    "the f64 reference expands the program{with} to {} tasks",
                    w.tasks()
                );
            }
            if !host_tools::inspect::is_valid(&bytes) {
                bail!("{} is not a valid table", table.display());
            }
            if let Err(why) = verdict {
                bail!(
                    "{}: the table is valid, but a run of it fails: {why}",
                    table.display()
                );
            }
            Ok(true)
        }
    }
}

/// The heap ring of scratch tensors, where the table has some: its
/// high-water mark, stalls, and the arena bytes the scratch scopes saved.
fn print_heap(stats: &device_runtime::sched::RunStats) {
    let heap = host_tools::summary::heap_figures(stats);
    if let Some(h) = heap {
        say!(
            "  {:<20} high water {:>5} of {:>5} bytes, {} stalls; scratch scopes took {} bytes, arena saved {} bytes",
            "HEAP_RING_FULL",
            h.high_water,
            h.capacity,
            h.stalls,
            h.scratch_bytes,
            h.arena_saved
        );
    }
}

/// Prints the check of `arena` (and of the task count, when the run's is
/// known) and whether it passed.
fn report(w: &Loaded, arena: &Arena, ran: Option<usize>) -> (bool, Vec<Verification>) {
    let checks: Vec<Verification> = match w {
        Loaded::Named(w) => vec![w.verify(arena)],
        Loaded::File(f) => {
            say!("bound     {}", host_tools::workload_file::F32_BOUND);
            for note in &f.notes {
                say!("note      {note}");
            }
            let mut checks: Vec<Verification> =
                ran.map(|n| f.check_task_count(n)).into_iter().collect();
            checks.extend(f.check(arena));
            checks
        }
    };
    for v in &checks {
        say!("check     {v}");
    }
    let passed = checks.iter().all(Verification::passed);
    say!("{}", if passed { "PASS" } else { "FAIL" });
    (passed, checks)
}
