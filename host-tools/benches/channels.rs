//! The cost of a CSP token (issue 17): send + consume + the dependency a
//! token creates, in nanoseconds per token, against a same-process peer.
//!
//! Two programs issue the same 2N tasks, `b[i] = a[i] + 0` then
//! `c[i] = b[i] + 0` on 1 x 8 tiles:
//!
//! ```text
//! channels (depth D):                    baseline:
//!     channel ch(D)                          loop i in 0..N:
//!     process producer:                          b[i] = a[i] + zero
//!         loop i in 0..N:                        c[i] = b[i] + zero
//!             b[i] = a[i] + zero
//!             send ch, i
//!     process consumer:
//!         consume ch as t:
//!             c[t] = b[t] + zero
//! ```
//!
//! The tasks and their regions are the same; the channel program adds a
//! `SEND`, a `CONSUME` iteration, two processes taking turns and the
//! token's dependency per i. Figures:
//!
//! 1. The device's expander ([`Expander::step_into`], one spec filled in
//!    place) with the orchestrator's answers stubbed: no writer pending and
//!    every task completed the moment it is issued (a device whose kernels
//!    finish at once), ns per token for both programs; the difference is
//!    the cost of the token. The baseline puts one instruction between
//!    its two calls ([`Program::Baseline`]); the figure without it is
//!    printed too (before the call-site cache hashed the pc, two adjacent
//!    three-argument calls shared an entry and decoded on every
//!    iteration). `WSP_BENCH_PROFILE=baseline|adjacent|DEPTH` expands one
//!    program of 10,000 tokens once, untimed, for callgrind: the inclusive
//!    instructions of `Expander::step_into` / 10,000 are its instructions
//!    per token.
//! 2. End to end in semantic time ([`run_semantic`] on 4 vector cores):
//!    wall-clock ns per token of the whole run (expansion, orchestration,
//!    scheduling and the kernels' execution on the host, small tiles).
//! 3. The peer: a bounded SPSC channel between two threads of one process
//!    (`std::sync::mpsc::sync_channel(D)`) carrying N `u64`s. The peer
//!    uses two threads, which on a small shared machine (the figures in
//!    BENCHMARKS.md: 2 cores shared with other jobs) compete with each
//!    other and with everything else; ours runs on one thread.
//! 4. The static footprint: `BYTES_PER_CHANNEL` and the whole expander.
//!
//! Every run checks that it issued 2N tasks, and the expander's runs that
//! the tasks' rows sum to what 0..N twice sums to (so the tokens carried
//! their values); the semantic runs check c = a.
//!
//! Run: `cargo bench -p host-tools --bench channels`. Prints medians over
//! 9 runs. `WSP_BENCH_SMOKE=1` uses small N, once (the CI smoke run).

use std::hint::black_box;
use std::sync::mpsc::sync_channel;
use std::time::Instant;

use device_runtime::abi::program::*;
use device_runtime::abi::{Region, Table, TensorDesc};
use device_runtime::channel::BYTES_PER_CHANNEL;
use device_runtime::expand::{Context, Expander, Next, TaskSpec, Wait};
use device_runtime::orch::TaskId;
use device_runtime::sched::RunOptions;
use host_tools::asm::{Asm, READ, WRITE};
use host_tools::semantic::run_semantic;
use host_tools::table::{Arena, TableBuilder, TensorId};
use wsp_ffi::{CoreKind, WspKernelId_WSP_KERNEL_ADD as ADD};

/// Columns of a tile (and of the tensors); a tile is one row.
const COLS: u32 = 8;
/// Channel depths measured.
const DEPTHS: [u32; 2] = [1, 4];

/// Registers of the programs: the loop or token value, the columns, N.
const R_I: u8 = 0;
const R_COLS: u8 = 8;
const R_N: u8 = 9;
/// The register the baseline's padding instruction writes.
const R_PAD: u8 = 10;

/// `out[row] = x[row] + zero[0]` on one row of `COLS` (register `R_COLS`)
/// of 2-D tensors.
fn add_row(asm: &mut Asm, x: TensorId, zero: TensorId, out: TensorId, row: u8) {
    asm.call(ADD);
    asm.arg(x, READ, row, NO_REG, R_COLS);
    asm.arg(zero, READ, NO_REG, NO_REG, R_COLS);
    asm.arg(out, WRITE, row, NO_REG, R_COLS);
}

/// The tensors a, zero, b, c of N rows (zero: one).
struct Tensors {
    a: TensorId,
    zero: TensorId,
    b: TensorId,
    c: TensorId,
}

/// The program of a table.
#[derive(Clone, Copy)]
enum Program {
    /// Producer and consumer processes and a channel of this depth.
    Channel(u32),
    /// One loop issuing both calls. `pad`: one instruction (a `CONST`)
    /// between the calls, so that they fall in different slots of the
    /// expander's call-site cache (keyed by the pc modulo
    /// [`CALL_SITES`](device_runtime::expand::CALL_SITES)); without it the
    /// two calls, four instructions apart, share a slot and each is
    /// decoded anew every time.
    Baseline { pad: bool },
}

/// A table of `n` tokens (or loop iterations) running `program`.
fn table(n: u32, program: Program) -> (Vec<u8>, TableBuilder, Tensors) {
    let mut tb = TableBuilder::new();
    let t = Tensors {
        a: tb.tensor("a", &[n, COLS]).unwrap(),
        zero: tb.tensor("zero", &[1, COLS]).unwrap(),
        b: tb.tensor("b", &[n, COLS]).unwrap(),
        c: tb.tensor("c", &[n, COLS]).unwrap(),
    };
    tb.declare_kernel(ADD).unwrap();
    let mut asm = Asm::default();
    if let Program::Channel(depth) = program {
        asm.channel(0, depth, 0);
    }
    asm.konst(R_COLS, COLS as i64);
    asm.konst(R_N, n as i64);
    match program {
        Program::Channel(_) => {
            let producer = asm.process(NO_REG, NO_REG, 1);
            let l = asm.looop(R_I, R_N, LOOP_PARALLEL, n);
            add_row(&mut asm, t.a, t.zero, t.b, R_I);
            asm.send(0, R_I);
            asm.end(l);
            asm.process_end(producer);
            let consumer = asm.process(NO_REG, NO_REG, 1);
            let c = asm.consume(R_I, 0);
            add_row(&mut asm, t.b, t.zero, t.c, R_I);
            asm.end(c);
            asm.process_end(consumer);
        }
        Program::Baseline { pad } => {
            let l = asm.looop(R_I, R_N, LOOP_PARALLEL, n);
            add_row(&mut asm, t.a, t.zero, t.b, R_I);
            if pad {
                asm.konst(R_PAD, 0);
            }
            add_row(&mut asm, t.b, t.zero, t.c, R_I);
            asm.end(l);
        }
    }
    tb.set_program(asm.code);
    let bytes = tb.finish().unwrap();
    Table::parse(&bytes).expect("the bench's programs are valid");
    (bytes, tb, t)
}

/// The orchestrator's answers for a device whose kernels finish at once:
/// no writer pending, every task completed, a clock that stays at 0.
struct Instantly {
    next: u64,
}

impl Context for Instantly {
    fn symbol(&self, _: usize) -> Option<i64> {
        None
    }
    fn next_task(&self) -> u64 {
        self.next
    }
    fn pending_writer(&mut self, _: u32, _: &Region) -> Option<TaskId> {
        None
    }
    fn completed_since(&self, _: u64) -> bool {
        true
    }
    fn read_i32(&mut self, _: &TensorDesc, _: u64) -> i32 {
        0
    }
    fn task_done(&self, _: u64) -> bool {
        true
    }
}

/// What an expansion gave: tasks, the sum of their output rows, and the
/// steps that returned a wait.
type Expanded = (u64, u64, u64);

/// Expands the whole program (the timed work). Not inlined, so that a
/// profiler can count it on its own.
#[inline(never)]
fn expand_all(table: &Table<'_>) -> Expanded {
    let mut expander = Expander::new(table);
    let mut cx = Instantly { next: 0 };
    let mut spec = TaskSpec::empty();
    let mut rows = 0u64;
    let mut waits = 0u32;
    let mut all_waits = 0u64;
    loop {
        match expander.step_into(table, &mut cx, &mut spec).unwrap() {
            Next::Task => {
                rows += spec.args[2].region.offset[0] as u64;
                cx.next += 1;
                waits = 0;
            }
            Next::Done => break,
            Next::Wait(w) => {
                // Every task has completed: a wait that repeats can only
                // mean the expansion is stuck.
                waits += 1;
                all_waits += 1;
                assert!(
                    waits < 4,
                    "the expansion waits on {w:?} with nothing running"
                );
                black_box::<Option<Wait>>(Some(w));
            }
            Next::Yield | Next::Event { .. } => {}
        }
    }
    (cx.next, rows, all_waits)
}

/// Checks an expansion of `n` tokens: 2n tasks whose output rows are
/// 0..n twice.
fn check_expansion(n: u32, (tasks, rows, _): Expanded, what: &str) {
    let n = n as u64;
    assert_eq!(tasks, 2 * n, "{what}: tasks");
    assert_eq!(rows, n * (n - 1), "{what}: rows of the tasks");
}

/// The whole run in semantic time; returns the wall-clock ns.
fn semantic(bytes: &[u8], tb: &TableBuilder, t: &Tensors, n: u32, a: &[f32]) -> f64 {
    let mut arena = Arena::zeroed(tb.arena_size());
    arena.write_f32(tb.layout(t.a), a);
    let start = Instant::now();
    let run = run_semantic(
        bytes,
        &mut arena.bytes,
        &[CoreKind::Vector; 4],
        &RunOptions::default(),
    )
    .unwrap();
    let ns = start.elapsed().as_nanos() as f64;
    assert_eq!(run.stats.tasks, 2 * n as u64, "semantic run: tasks");
    assert_eq!(run.launches.len(), 2 * n as usize, "semantic run: launches");
    assert_eq!(arena.read_f32(tb.layout(t.c)), a, "c = a + 0 + 0");
    ns
}

/// The peer: `n` u64s through `sync_channel(depth)` from this thread to
/// another; returns the wall-clock ns.
fn peer(n: u32, depth: u32) -> f64 {
    let start = Instant::now();
    let (tx, rx) = sync_channel::<u64>(depth as usize);
    let sum = std::thread::scope(|s| {
        let consumer = s.spawn(move || rx.iter().sum::<u64>());
        for i in 0..n as u64 {
            tx.send(i).unwrap();
        }
        drop(tx);
        consumer.join().unwrap()
    });
    let ns = start.elapsed().as_nanos() as f64;
    assert_eq!(sum, n as u64 * (n as u64 - 1) / 2, "peer: every value");
    ns
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let smoke = std::env::var_os("WSP_BENCH_SMOKE").is_some();
    let (n_expand, n_semantic, n_peer, runs) = if smoke {
        (1_000, 200, 1_000, 1)
    } else {
        (200_000, 20_000, 200_000, 9)
    };
    let padded = Program::Baseline { pad: true };
    let adjacent = Program::Baseline { pad: false };

    if let Ok(which) = std::env::var("WSP_BENCH_PROFILE") {
        // One untimed expansion of one program, for callgrind: the
        // inclusive count of `Expander::step_into`, divided by N.
        let n = 10_000;
        let program = match which.as_str() {
            "baseline" => padded,
            "adjacent" => adjacent,
            depth => Program::Channel(
                depth
                    .parse()
                    .expect("WSP_BENCH_PROFILE: baseline, adjacent or a channel depth"),
            ),
        };
        let (bytes, ..) = table(n, program);
        let tab = Table::parse(&bytes).unwrap();
        check_expansion(n, expand_all(&tab), &which);
        println!("profiled {which}: N = {n}");
        return;
    }

    // 1. The expander.
    let bytes_of = |p| table(n_expand, p).0;
    let (base_bytes, adj_bytes) = (bytes_of(padded), bytes_of(adjacent));
    let chan_bytes: Vec<Vec<u8>> = DEPTHS
        .iter()
        .map(|&d| bytes_of(Program::Channel(d)))
        .collect();
    let base = Table::parse(&base_bytes).unwrap();
    let adj = Table::parse(&adj_bytes).unwrap();
    let chans: Vec<Table<'_>> = chan_bytes
        .iter()
        .map(|b| Table::parse(b).unwrap())
        .collect();
    let per_token = |table: &Table<'_>, what: &str| {
        let start = Instant::now();
        let got = expand_all(table);
        let ns = start.elapsed().as_nanos() as f64 / n_expand as f64;
        check_expansion(n_expand, got, what);
        ns
    };
    let (mut base_ns, mut adj_ns) = (Vec::new(), Vec::new());
    let mut chan_ns = vec![Vec::new(); DEPTHS.len()];
    for _ in 0..runs {
        base_ns.push(per_token(&base, "baseline"));
        adj_ns.push(per_token(&adj, "adjacent"));
        for (table, ns) in chans.iter().zip(&mut chan_ns) {
            ns.push(per_token(table, "channels"));
        }
    }
    let (base_ns, adj_ns) = (median(base_ns), median(adj_ns));
    let chan_ns: Vec<f64> = chan_ns.into_iter().map(median).collect();

    // 2. End to end in semantic time.
    let a: Vec<f32> = (0..n_semantic * COLS)
        .map(|i| (i % 251) as f32 - 125.0)
        .collect();
    let (sb, stb, st) = table(n_semantic, padded);
    let semantic_chans: Vec<_> = DEPTHS
        .iter()
        .map(|&d| table(n_semantic, Program::Channel(d)))
        .collect();
    let mut sbase = Vec::new();
    let mut schan = vec![Vec::new(); DEPTHS.len()];
    for _ in 0..runs {
        sbase.push(semantic(&sb, &stb, &st, n_semantic, &a) / n_semantic as f64);
        for ((bytes, tb, t), ns) in semantic_chans.iter().zip(&mut schan) {
            ns.push(semantic(bytes, tb, t, n_semantic, &a) / n_semantic as f64);
        }
    }
    let sbase = median(sbase);
    let schan: Vec<f64> = schan.into_iter().map(median).collect();

    // 3. The peer.
    let peer_ns: Vec<f64> = DEPTHS
        .iter()
        .map(|&d| median((0..runs).map(|_| peer(n_peer, d) / n_peer as f64).collect()))
        .collect();

    println!("CSP token channels: N tokens, 2N tasks (b[i] = a[i] + 0; c[i] = b[i] + 0, 1 x {COLS} tiles)");
    println!(
        "  footprint                 {BYTES_PER_CHANNEL} bytes per channel ({MAX_CHANNELS} channels: {} bytes); whole expander {} bytes",
        BYTES_PER_CHANNEL * MAX_CHANNELS,
        std::mem::size_of::<Expander>()
    );
    println!("  expander, N = {n_expand}, every task done at once (median of {runs}):");
    println!("    no channel              {base_ns:.1} ns per i (2 tasks)");
    println!(
        "    no channel, adjacent    {adj_ns:.1} ns per i (no instruction between the two calls)"
    );
    for ((d, ns), table) in DEPTHS.iter().zip(&chan_ns).zip(&chans) {
        // Untimed: how often a step found every context parked.
        let waits = expand_all(table).2 as f64 / n_expand as f64;
        println!(
            "    depth {d}                 {ns:.1} ns per token (2 tasks); the token {:+.1} ns; {waits:.2} waiting steps per token",
            ns - base_ns
        );
    }
    println!("  semantic run, N = {n_semantic}, 4 vector cores, wall clock (median of {runs}):");
    println!("    no channel              {sbase:.0} ns per i (2 tasks)");
    for (d, ns) in DEPTHS.iter().zip(&schan) {
        println!(
            "    depth {d}                 {ns:.0} ns per token (2 tasks); the token {:+.0} ns",
            ns - sbase
        );
    }
    println!("  peer: std::sync::mpsc::sync_channel, N = {n_peer} (median of {runs}), two threads on a shared machine:");
    for (i, d) in DEPTHS.iter().enumerate() {
        println!(
            "    depth {d}                 {:.1} ns per value; ours/peer: expander {:.3} (the token alone {:.3}), semantic run {:.2}",
            peer_ns[i],
            chan_ns[i] / peer_ns[i],
            (chan_ns[i] - base_ns) / peer_ns[i],
            schan[i] / peer_ns[i]
        );
    }
}
