//! Token channels and processes in the device runtime, driven by programs
//! written instruction by instruction (independent of the workload
//! language's lowering): a three-stage pipeline at every channel depth on
//! the threaded shim and in semantic time, the token's dependency, the
//! channel latency, the stall figures, and every channel deadlock and
//! validation error with the content of its report.

use device_runtime::abi::program::*;
use device_runtime::abi::{Instr, Problem, Section, Table, TableError};
use device_runtime::channel::{ChannelDeadlockCause, Park};
use device_runtime::expand::ExpandError;
use device_runtime::orch::StallReason;
use device_runtime::sched::{RunError, RunOptions};
use host_tools::semantic::{run_semantic, SemanticRun};
use host_tools::shim::{Shim, ShimError};
use host_tools::table::{Arena, TableBuilder, TensorId};
use wsp_ffi::{CoreKind, WspKernelId_WSP_KERNEL_ADD as ADD};
use zerocopy::byteorder::little_endian::U32;

use host_tools::asm::{Asm, READ, WRITE};

/// Tile side and tile count of the pipeline.
const T: i64 = 8;
const TILES: i64 = 8;

/// `c = a + b` on T x T tiles at rows `ra`, `rb`, `rc` (registers, or
/// `NO_REG` for row 0) of 2-D tensors; `ext` holds T.
fn add(a: &mut Asm, x: (TensorId, u8), y: (TensorId, u8), z: (TensorId, u8), ext: u8) {
    a.call(ADD);
    for ((t, row), access) in [(x, READ), (y, READ), (z, WRITE)] {
        a.arg(t, access, row, ext, ext);
    }
}

/// The tensors of the pipeline: x (the tiles), zero, two staging buffers
/// of two slots, out.
struct Pipe {
    b: TableBuilder,
    slots: u32,
    x: TensorId,
    zero: TensorId,
    stage: TensorId,
    squared: TensorId,
    out: TensorId,
}

fn pipe() -> Pipe {
    pipe_with(2)
}

/// The pipeline's tensors with `slots` staging slots.
fn pipe_with(slots: u32) -> Pipe {
    let mut b = TableBuilder::new();
    let rows = (T * TILES) as u32;
    let x = b.tensor("x", &[rows, T as u32]).unwrap();
    let zero = b.tensor("zero", &[T as u32, T as u32]).unwrap();
    let stage = b.tensor("stage", &[slots * T as u32, T as u32]).unwrap();
    let squared = b.tensor("squared", &[slots * T as u32, T as u32]).unwrap();
    let out = b.tensor("out", &[rows, T as u32]).unwrap();
    b.declare_kernel(ADD).unwrap();
    Pipe {
        b,
        slots,
        x,
        zero,
        stage,
        squared,
        out,
    }
}

/// Registers: 8 = T, 9 = TILES, 10 = 2 (slots).
fn constants(a: &mut Asm) {
    a.konst(8, T);
    a.konst(9, TILES);
    a.konst(10, 2);
}

/// Registers of [`constants`], with 10 = `slots`.
fn constants_with(a: &mut Asm, slots: u32) {
    a.konst(8, T);
    a.konst(9, TILES);
    a.konst(10, slots as i64);
}

/// Loader -> doubler -> storer over `TILES` tiles through staging buffers
/// of `p.slots` slots, the tile index carried by the tokens (the slot is
/// index % slots): out = 2 x, written by the storer. A channel's depth
/// must not exceed the slots: the loader reuses slot `s` once the token
/// `slots` before has been consumed (its body ended), which the depth
/// guarantees only up to the slots.
fn pipeline(p: &Pipe, depth: u32, latency: u32) -> Vec<Instr> {
    assert!(depth <= p.slots);
    let mut a = Asm::default();
    a.channel(0, depth, latency);
    a.channel(1, depth, latency);
    constants_with(&mut a, p.slots);
    // Loader: stage[i % 2] = x[i] + 0; send i.
    let loader = a.process(NO_REG, NO_REG, 1);
    let l = a.looop(0, 9, LOOP_PARALLEL, TILES as u32);
    a.arith(OP_MUL, 1, 0, 8);
    a.arith(OP_REM, 2, 0, 10);
    a.arith(OP_MUL, 3, 2, 8);
    add(&mut a, (p.x, 1), (p.zero, NO_REG), (p.stage, 3), 8);
    a.send(0, 0);
    a.end(l);
    a.process_end(loader);
    // Doubler: squared[s] = stage[s] + stage[s]; send i.
    let doubler = a.process(NO_REG, NO_REG, 1);
    let c = a.consume(0, 0);
    a.arith(OP_REM, 2, 0, 10);
    a.arith(OP_MUL, 3, 2, 8);
    add(&mut a, (p.stage, 3), (p.stage, 3), (p.squared, 3), 8);
    a.send(1, 0);
    a.end(c);
    a.process_end(doubler);
    // Storer: out[i] = squared[s] + 0.
    let storer = a.process(NO_REG, NO_REG, 1);
    let c = a.consume(0, 1);
    a.arith(OP_REM, 2, 0, 10);
    a.arith(OP_MUL, 3, 2, 8);
    a.arith(OP_MUL, 1, 0, 8);
    add(&mut a, (p.squared, 3), (p.zero, NO_REG), (p.out, 1), 8);
    a.end(c);
    a.process_end(storer);
    a.code
}

fn build(p: &mut Pipe, program: Vec<Instr>) -> Vec<u8> {
    p.b.set_program(program);
    p.b.finish().unwrap()
}

fn arena(p: &Pipe) -> (Arena, Vec<f32>) {
    let mut arena = Arena::zeroed(p.b.arena_size());
    let n = (T * T * TILES) as usize;
    let x: Vec<f32> = (0..n)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 8.0)
        .collect();
    arena.write_f32(p.b.layout(p.x), &x);
    (arena, x)
}

/// out = 2 x exactly (a sum of two equal f32 is exact).
fn check_doubled(p: &Pipe, arena: &Arena, x: &[f32]) {
    let out = arena.read_f32(p.b.layout(p.out));
    for (i, (&o, &v)) in out.iter().zip(x).enumerate() {
        assert_eq!(o as f64, 2.0 * v as f64, "element {i}");
    }
}

/// The launches whose output (argument 2) lies in tensor `t`, in issue order.
fn writes(
    p: &Pipe,
    run: &SemanticRun,
    arena: &Arena,
    t: TensorId,
) -> Vec<host_tools::semantic::Launch> {
    let base = arena.bytes.as_ptr() as u64 + p.b.layout(t).arena_offset;
    let len = 4 * p.b.layout(t).elements() as u64;
    run.launches
        .iter()
        .filter(|l| (base..base + len).contains(&l.args.tensors[2].addr))
        .copied()
        .collect()
}

const VECTOR4: [CoreKind; 4] = [CoreKind::Vector; 4];

fn semantic(table: &[u8], arena: &mut Arena) -> Result<SemanticRun, ShimError> {
    run_semantic(table, &mut arena.bytes, &VECTOR4, &RunOptions::default())
}

fn shim(table: &[u8], arena: &mut Arena) -> Result<u64, ShimError> {
    let shim = Shim {
        cube_cores: 0,
        vector_cores: 4,
        ..Shim::default()
    };
    shim.run(table, &mut arena.bytes).map(|s| s.tasks)
}

fn run_error(e: ShimError) -> RunError {
    match e {
        ShimError::Run(r) => *r,
        other => panic!("not a run error: {other}"),
    }
}

#[test]
fn the_pipeline_runs_at_every_depth_on_the_shim_and_in_semantic_time() {
    for depth in [0, 1, 2, 4] {
        let mut p = pipe_with(depth.max(2));
        let table = {
            let code = pipeline(&p, depth, 0);
            build(&mut p, code)
        };
        let (mut a, x) = arena(&p);
        let run = semantic(&table, &mut a).unwrap();
        assert_eq!(run.stats.tasks, 3 * TILES as u64, "depth {depth}");
        check_doubled(&p, &a, &x);
        let (mut b, _) = arena(&p);
        assert_eq!(shim(&table, &mut b).unwrap(), 3 * TILES as u64);
        check_doubled(&p, &b, &x);
        // The shim's bytes equal semantic time's.
        assert_eq!(a.bytes, b.bytes, "depth {depth}");
        // Each channel holds at most its capacity (one slot for a
        // rendezvous), and a sender found it full at some point.
        let full = run.stats.stalls.resources[StallReason::ChannelFull as usize];
        assert!(
            full.high_water <= depth.max(1) as u64,
            "depth {depth}: {full:?}"
        );
        assert!(full.high_water >= 1);
        assert!(full.stalls > 0, "depth {depth}: {full:?}");
        let empty = run.stats.stalls.resources[StallReason::ChannelEmpty as usize];
        assert!(empty.stalls > 0 && empty.stall_ticks > 0, "{empty:?}");
    }
}

/// Each consumer task starts after the task its token stands for ended.
/// The storer's task shares no region with the doubler's (squared is read,
/// out written... it does share `squared`); so check the doubler against
/// the loader through a token whose task writes nothing the consumer
/// reads: a loader that writes `out` rows instead (no region in common
/// with the consumer's).
#[test]
fn a_consumer_task_waits_for_its_token_task_beyond_regions() {
    let mut p = pipe();
    let mut a = Asm::default();
    a.channel(0, 1, 0);
    constants(&mut a);
    let producer = a.process(NO_REG, NO_REG, 1);
    let l = a.looop(0, 9, LOOP_PARALLEL, TILES as u32);
    a.arith(OP_MUL, 1, 0, 8);
    // Writes out[i]; the consumer reads x and writes stage: disjoint.
    add(&mut a, (p.x, 1), (p.zero, NO_REG), (p.out, 1), 8);
    a.send(0, 0);
    a.end(l);
    a.process_end(producer);
    let consumer = a.process(NO_REG, NO_REG, 1);
    let c = a.consume(0, 0);
    a.arith(OP_MUL, 1, 0, 8);
    a.arith(OP_REM, 2, 0, 10);
    a.arith(OP_MUL, 3, 2, 8);
    add(&mut a, (p.x, 1), (p.x, 1), (p.stage, 3), 8);
    a.end(c);
    a.process_end(consumer);
    let table = build(&mut p, a.code);
    let (mut arena, _) = arena(&p);
    let run = semantic(&table, &mut arena).unwrap();
    let producers = writes(&p, &run, &arena, p.out);
    let consumers = writes(&p, &run, &arena, p.stage);
    assert_eq!(
        (producers.len(), consumers.len()),
        (TILES as usize, TILES as usize)
    );
    // Consumer k took token k (one consumer: tokens in order).
    for (k, (p, c)) in producers.iter().zip(&consumers).enumerate() {
        assert!(
            c.start >= p.end,
            "token {k}: consumer starts {} before its producer ends {}",
            c.start,
            p.end
        );
    }
    // With four cores and no region in common, the producers run in
    // parallel: without the token, consumer 0 could start at once.
    assert!(consumers[0].start > 0);
}

#[test]
fn a_channel_latency_delays_the_consumer_in_semantic_time() {
    const LATENCY: u32 = 5000;
    let mut p = pipe();
    let table = {
        let code = pipeline(&p, 2, LATENCY);
        build(&mut p, code)
    };
    let (mut a, x) = arena(&p);
    let run = semantic(&table, &mut a).unwrap();
    check_doubled(&p, &a, &x);
    let (loads, doubles, stores) = (
        writes(&p, &run, &a, p.stage),
        writes(&p, &run, &a, p.squared),
        writes(&p, &run, &a, p.out),
    );
    for i in 0..TILES as usize {
        // Issued no earlier than the token's task's end plus the latency.
        assert!(
            doubles[i].issued >= loads[i].end + LATENCY as u64,
            "tile {i}"
        );
        assert!(
            stores[i].issued >= doubles[i].end + LATENCY as u64,
            "tile {i}"
        );
    }
    // And the run's makespan has at least the two latencies of the last tile.
    let (mut b, _) = arena(&p);
    let plain = {
        let mut q = pipe();
        let t = {
            let code = pipeline(&q, 2, 0);
            build(&mut q, code)
        };
        semantic(&t, &mut b).unwrap().makespan
    };
    assert!(
        run.makespan >= plain + 2 * LATENCY as u64,
        "{} vs {plain}",
        run.makespan
    );
}

/// Two processes that each consume before they send: a cycle.
#[test]
fn a_cycle_of_processes_ends_with_a_report() {
    let mut p = pipe();
    let mut a = Asm::default();
    a.channel(0, 1, 0);
    a.channel(1, 1, 0);
    constants(&mut a);
    for (from, to) in [(0, 1), (1, 0)] {
        let proc_ = a.process(NO_REG, NO_REG, 1);
        let c = a.consume(0, from);
        add(
            &mut a,
            (p.x, NO_REG),
            (p.zero, NO_REG),
            (p.stage, NO_REG),
            8,
        );
        a.send(to, 0);
        a.end(c);
        a.process_end(proc_);
    }
    let table = build(&mut p, a.code);
    for runner in [semantic_err, shim_err] {
        let (mut arena, _) = arena(&p);
        let RunError::ChannelDeadlock(report) = runner(&table, &mut arena) else {
            panic!("not a channel deadlock");
        };
        assert_eq!(report.cause(), ChannelDeadlockCause::Cycle);
        let parked: Vec<_> = report.processes.iter().flatten().map(|p| p.park).collect();
        assert_eq!(
            parked,
            [
                Some(Park::Empty {
                    channel: 0,
                    task: None
                }),
                Some(Park::Empty {
                    channel: 1,
                    task: None
                })
            ]
        );
        let text = report.to_string();
        for needle in [
            "channel deadlock",
            "process of pc 5, replica 0 (at pc 6)",
            "CONSUME waits for a token on channel 0",
            "CONSUME waits for a token on channel 1",
            "channel 0: capacity 1, 0 token(s) queued, 0 in consumer bodies, open, 1 live sender(s), 0 sent",
            "cycle",
            "raise the capacity",
        ] {
            assert!(text.contains(needle), "missing {needle:?} in\n{text}");
        }
    }
}

fn semantic_err(table: &[u8], arena: &mut Arena) -> RunError {
    run_error(semantic(table, arena).expect_err("the run must fail"))
}

fn shim_err(table: &[u8], arena: &mut Arena) -> RunError {
    run_error(shim(table, arena).expect_err("the run must fail"))
}

/// The sender process starts zero replicas: the channel stays open with
/// no live sender and the consumer would wait forever.
#[test]
fn a_consumer_without_a_live_sender_ends_with_a_report() {
    let mut p = pipe();
    let mut a = Asm::default();
    a.channel(3, 2, 0);
    constants(&mut a);
    a.konst(11, 0);
    let senders = a.process(0, 11, 4);
    add(
        &mut a,
        (p.x, NO_REG),
        (p.zero, NO_REG),
        (p.stage, NO_REG),
        8,
    );
    a.send(3, 0);
    a.process_end(senders);
    let c = a.consume(0, 3);
    add(
        &mut a,
        (p.stage, NO_REG),
        (p.zero, NO_REG),
        (p.out, NO_REG),
        8,
    );
    a.end(c);
    let table = build(&mut p, a.code);
    for runner in [semantic_err, shim_err] {
        let (mut arena, _) = arena(&p);
        let RunError::ChannelDeadlock(report) = runner(&table, &mut arena) else {
            panic!("not a channel deadlock");
        };
        assert_eq!(
            report.cause(),
            ChannelDeadlockCause::NoLiveSender { channel: 3 }
        );
        let text = report.to_string();
        for needle in [
            "the program (at pc",
            "CONSUME waits for a token on channel 3",
            "channel 3: capacity 2, 0 token(s) queued, 0 in consumer bodies, open, 0 live sender(s), 0 sent",
            "no live process sends on channel 3",
            "zero replicas",
        ] {
            assert!(text.contains(needle), "missing {needle:?} in\n{text}");
        }
    }
    // With one replica the same program runs: the sender's end closes
    // the channel and the consumer's loop ends.
    let mut q = pipe();
    let mut code = table_program(&table);
    code.iter_mut()
        .filter(|i| i.op == OP_CONST && i.r == 11)
        .for_each(|i| i.imm = U32::new(1));
    let table = build(&mut q, code);
    let (mut arena, _) = arena(&q);
    assert_eq!(semantic(&table, &mut arena).unwrap().stats.tasks, 2);
}

fn table_program(table: &[u8]) -> Vec<Instr> {
    Table::parse(table).unwrap().program().to_vec()
}

/// More tokens in flight (two channels of 16) than the task window (4)
/// holds: a token does not pin its task, so the window only paces.
#[test]
fn tokens_in_flight_need_no_room_in_the_task_window() {
    let mut p = pipe_with(16);
    let mut code = pipeline(&p, 16, 0);
    code.insert(0, {
        let mut a = Asm::default();
        a.op(OP_WINDOW, 0, [NO_REG; 6], 4, 0);
        a.code[0]
    });
    // Every pc named in an operand moved by one.
    for ins in &mut code[1..] {
        match ins.op {
            OP_LOOP | OP_END | OP_PROCESS | OP_PROCESS_END => ins.imm = U32::new(ins.imm.get() + 1),
            OP_CONSUME => ins.imm2 = U32::new(ins.imm2.get() + 1),
            _ => {}
        }
    }
    let table = build(&mut p, code);
    let (mut a, x) = arena(&p);
    let run = semantic(&table, &mut a).unwrap();
    check_doubled(&p, &a, &x);
    assert_eq!(run.stats.window, 4);
}

#[test]
fn a_send_on_a_closed_channel_is_an_error() {
    let mut p = pipe();
    let mut a = Asm::default();
    a.channel(0, 2, 0);
    constants(&mut a);
    a.op(OP_CLOSE, 0, [NO_REG; 6], 0, 0);
    add(
        &mut a,
        (p.x, NO_REG),
        (p.zero, NO_REG),
        (p.stage, NO_REG),
        8,
    );
    a.send(0, 0);
    // The error names the call whose send it is (the device reserves the
    // token's room when it reaches the call), not the first instruction
    // of the expansion step that ran into it.
    let call = a.code.iter().position(|i| i.op == OP_CALL).unwrap() as u32;
    assert!(call > 0);
    let table = build(&mut p, a.code);
    for run in [semantic_err, shim_err] {
        let (mut arena, _) = arena(&p);
        let e = run(&table, &mut arena);
        assert!(
            matches!(
                e,
                RunError::Expand {
                    pc,
                    why: ExpandError::SendOnClosed { channel: 0 },
                } if pc == call
            ),
            "{e}"
        );
        assert!(
            e.to_string().contains(&format!(
                "program instruction {call}: sends on channel 0, which is closed"
            )),
            "{e}"
        );
    }
}

#[test]
fn replicated_consumers_share_a_channel() {
    // Two doubler replicas consume one channel; each token goes to one.
    let mut p = pipe();
    let mut a = Asm::default();
    a.channel(0, 2, 0);
    constants(&mut a);
    let loader = a.process(NO_REG, NO_REG, 1);
    let l = a.looop(0, 9, LOOP_PARALLEL, TILES as u32);
    a.arith(OP_MUL, 1, 0, 8);
    a.send(0, 0);
    a.end(l);
    a.process_end(loader);
    a.konst(12, 2);
    let doublers = a.process(5, 12, 2);
    let c = a.consume(0, 0);
    a.arith(OP_MUL, 1, 0, 8);
    add(&mut a, (p.x, 1), (p.x, 1), (p.out, 1), 8);
    a.end(c);
    a.process_end(doublers);
    let table = build(&mut p, a.code);
    let (mut arena, x) = arena(&p);
    let run = semantic(&table, &mut arena).unwrap();
    assert_eq!(run.stats.tasks, TILES as u64);
    check_doubled(&p, &arena, &x);
}

fn validation(program: Vec<Instr>) -> TableError {
    let mut p = pipe();
    p.b.set_program(program);
    let bytes = p.b.finish().unwrap();
    Table::parse(&bytes).expect_err("validation must refuse it")
}

#[test]
fn validation_names_bad_channel_programs() {
    let p = pipe();
    // A consume on an undeclared channel.
    let mut a = Asm::default();
    a.channel(0, 1, 0);
    a.send(0, NO_REG);
    let c = a.consume(0, 5);
    a.end(c);
    let e = validation(a.code);
    assert_eq!((e.section, e.index, e.field), (Section::Program, 2, "imm"));
    assert_eq!(e.problem, Problem::UndeclaredChannel { channel: 5 });
    assert!(e.to_string().contains("channel 5 is not declared"), "{e}");
    // A channel nobody sends on.
    let mut a = Asm::default();
    a.channel(0, 1, 0);
    a.channel(1, 1, 0);
    a.send(0, NO_REG);
    let c = a.consume(0, 1);
    add(
        &mut a,
        (p.x, NO_REG),
        (p.zero, NO_REG),
        (p.stage, NO_REG),
        8,
    );
    a.end(c);
    let e = validation(a.code);
    assert_eq!((e.index, e.field), (1, "imm"));
    assert_eq!(e.problem, Problem::NoSender { channel: 1 });
    assert!(e.to_string().contains("nothing sends on channel 1"), "{e}");
    // A capacity above the maximum.
    let mut a = Asm::default();
    a.channel(0, MAX_CHANNEL_CAPACITY as u32 + 1, 0);
    a.send(0, NO_REG);
    let e = validation(a.code);
    assert_eq!((e.index, e.field), (0, "imm2"));
    assert_eq!(
        e.problem,
        Problem::OutOfRange {
            value: MAX_CHANNEL_CAPACITY as u64 + 1,
            min: 0,
            max: MAX_CHANNEL_CAPACITY as u64
        }
    );
    // A process inside a loop.
    let mut a = Asm::default();
    a.konst(9, 2);
    let l = a.looop(0, 9, LOOP_PARALLEL, 2);
    let pr = a.process(NO_REG, NO_REG, 1);
    a.process_end(pr);
    a.end(l);
    let e = validation(a.code);
    assert_eq!((e.index, e.field), (2, "op"));
    assert!(e.to_string().contains("PROCESS inside a loop"), "{e}");
    // A jump out of a process body.
    let mut a = Asm::default();
    let pr = a.process(NO_REG, NO_REG, 1);
    a.op(OP_JUMP, 0, [NO_REG; 6], 3, 0);
    a.process_end(pr);
    a.konst(1, 1);
    let e = validation(a.code);
    assert_eq!((e.index, e.field), (1, "op"));
    assert!(e.to_string().contains("jump leaves its loop"), "{e}");
}

/// A process's sequential loop waits for its own tasks of the iteration,
/// not for another process's: a long task of one process does not hold
/// back the iterations of the other.
#[test]
fn a_sequential_loop_of_a_process_waits_for_its_own_tasks_only() {
    let mut b = TableBuilder::new();
    let big_a = b.tensor("big_a", &[64, 64]).unwrap();
    let big_c = b.tensor("big_c", &[64, 64]).unwrap();
    let small = b.tensor("small", &[4 * T as u32, T as u32]).unwrap();
    let small_out = b.tensor("small_out", &[4 * T as u32, T as u32]).unwrap();
    let zero = b.tensor("zero", &[T as u32, T as u32]).unwrap();
    b.declare_kernel(ADD).unwrap();
    let mut a = Asm::default();
    a.konst(8, T);
    a.konst(7, 64);
    a.konst(9, 4);
    // The steps first: its first iteration's task comes before the long
    // task, whose number is then inside the iteration's range.
    let steps = a.process(NO_REG, NO_REG, 1);
    let x = [9, LOOP_SEQUENTIAL, NO_REG, NO_REG, NO_REG, NO_REG];
    let l = a.op(OP_LOOP, 0, x, 0, 4);
    a.arith(OP_MUL, 1, 0, 8);
    add(&mut a, (small, 1), (zero, NO_REG), (small_out, 1), 8);
    a.end(l);
    a.process_end(steps);
    let long = a.process(NO_REG, NO_REG, 1);
    add(&mut a, (big_a, NO_REG), (big_a, NO_REG), (big_c, NO_REG), 7);
    a.process_end(long);
    b.set_program(a.code);
    let table = b.finish().unwrap();
    let mut arena = Arena::zeroed(b.arena_size());
    let run = semantic(&table, &mut arena).unwrap();
    assert_eq!(run.stats.tasks, 5);
    let long_end = run.launches.iter().map(|l| l.end).max().unwrap();
    let base = arena.bytes.as_ptr() as u64 + b.layout(small_out).arena_offset;
    let steps: Vec<_> = run
        .launches
        .iter()
        .filter(|l| l.args.tensors[2].addr >= base && l.args.tensors[2].addr < base + 4 * 4 * 64)
        .collect();
    assert_eq!(steps.len(), 4);
    // In order, each after the one before, all before the long task ends.
    for w in steps.windows(2) {
        assert!(w[1].start >= w[0].end);
    }
    assert!(steps[3].end < long_end, "{} vs {long_end}", steps[3].end);
}
