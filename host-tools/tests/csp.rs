//! CSP in the workload language: channels, processes, send, consume and
//! close lowered to the program's ops (checked against hand-written
//! expectations), the builder's errors, and the device's validation of
//! bad CSP programs (the instruction, field and problem named).

use device_runtime::abi::program::*;
use device_runtime::abi::{Instr, Problem, Section, Table};
use host_tools::inspect::{inspect_named, inspect_with};
use host_tools::program::{Axis, Call, Channel, Expr, LowerError, Workload};
use host_tools::table::{TableBuilder, TensorId};
use host_tools::task_count::{count_tasks, TaskCount};
use wsp_ffi::WspKernelId_WSP_KERNEL_ADD as ADD;
use zerocopy::little_endian::U32;

/// (op, r, x[0], imm, imm2) of each instruction of a built table.
fn ops(table: &[u8]) -> Vec<(u8, u8, u8, u32, u32)> {
    Table::parse(table)
        .unwrap()
        .program()
        .iter()
        .map(|i| (i.op, i.r, i.x[0], i.imm.get(), i.imm2.get()))
        .collect()
}

/// `y = x + x` on the 8 x 8 tile at `row` (the values do not matter
/// here; `y` is tensor 1).
fn touch(w: &mut Workload, x: TensorId, row: Expr) -> Call {
    let y = TensorId(1);
    w.call(
        ADD,
        &[
            x.tile(row.clone(), 0, 8, 8),
            x.tile(row.clone(), 0, 8, 8),
            y.tile(row, 0, 8, 8),
        ],
        &[],
    )
}

/// A producer and a consumer over one channel.
fn pipeline(depth: u32) -> Result<(Workload, Channel), LowerError> {
    let mut w = Workload::new();
    let x = w.tensor("x", &[64, 64])?;
    w.tensor("y", &[64, 64])?;
    let ch = w.channel_with_latency("tiles", depth, 7)?;
    w.process("loader", |w| {
        let c = touch(w, x, Expr::Const(0));
        w.send(ch, 5, c);
    });
    w.process("storer", |w| {
        w.consume(ch, |w, t| {
            touch(w, x, t * 8);
        });
    });
    Ok((w, ch))
}

#[test]
fn channels_and_processes_lower_to_the_expected_ops() {
    let (mut w, _) = pipeline(2).unwrap();
    let table = w.finish().unwrap();
    let n = NO_REG;
    let got = ops(&table);
    // CHANNEL 0: capacity 2, latency 7 (bits 8..).
    assert_eq!(got[0], (OP_CHANNEL, 0, n, 0, 2 | 7 << 8));
    // loader: PROCESS (one replica: no registers), the call with its
    // offset register, SEND value 5, PROCESS_END.
    assert_eq!(got[1].0, OP_PROCESS);
    assert_eq!((got[1].1, got[1].2, got[1].4), (n, n, 1));
    let loader_end = got[1].3 as usize;
    assert_eq!(got[loader_end], (OP_PROCESS_END, 0, n, 1, 0));
    let body: Vec<u8> = got[2..loader_end].iter().map(|o| o.0).collect();
    // The send's value is computed before the call, so that the SEND
    // follows the call's operands directly (the device then reserves the
    // token's room before issuing the task).
    assert_eq!(
        body,
        [OP_CONST, OP_CONST, OP_CALL, OP_ARG, OP_ARG, OP_ARG, OP_SEND],
        "{got:?}"
    );
    let send = got[loader_end - 1];
    let value = got[2];
    assert_eq!((value.3, value.4), (5, 0), "CONST 5");
    assert_eq!(
        (send.2, send.3),
        (value.1, 0),
        "SEND value register, channel 0"
    );
    // storer: PROCESS, CONSUME r = a register, imm = channel, imm2 = its
    // END; the body's call offsets use the token register; END names the
    // CONSUME.
    let storer = loader_end + 1;
    assert_eq!(got[storer].0, OP_PROCESS);
    let consume = got[storer + 1];
    assert_eq!((consume.0, consume.3), (OP_CONSUME, 0));
    let token = consume.1;
    assert!((token as usize) < MAX_REGS);
    let end = consume.4 as usize;
    assert_eq!(got[end], (OP_END, 0, n, storer as u32 + 1, 0));
    assert!(
        got[storer + 2..end]
            .iter()
            .any(|o| o.0 == OP_MUL && (o.2 == token)),
        "the body computes its row from the token: {got:?}"
    );
    assert_eq!(got[end + 1], (OP_PROCESS_END, 0, n, storer as u32, 0));
    assert_eq!(got.len(), end + 2);
    // The names: channel 0 and the processes by the pc of their PROCESS.
    let names = w.csp_names();
    assert_eq!(names.channel(0), "tiles");
    assert_eq!((names.channels[0].depth, names.channels[0].latency), (2, 7));
    assert_eq!(names.process(1), "loader");
    assert_eq!(names.process(storer), "storer");
    assert_eq!(names.process(2), "process at pc 2");
}

#[test]
fn a_replicated_process_has_its_index_register_and_count() {
    let mut w = Workload::new();
    let x = w.tensor("x", &[64, 64]).unwrap();
    w.tensor("y", &[64, 64]).unwrap();
    let ch = w.channel("work", 0).unwrap();
    w.process_over("compute", Axis::Dense(4), |w, i| {
        let c = touch(w, x, i.clone() * 8);
        w.send(ch, i, c);
    });
    w.consume(ch, |_, _| {});
    w.close(ch);
    let table = w.finish().unwrap();
    let got = ops(&table);
    assert_eq!(got[0], (OP_CHANNEL, 0, NO_REG, 0, 0));
    // The count 4 in a register, then PROCESS r = the index, x[0] = that
    // register, imm2 = 4.
    assert_eq!((got[1].0, got[1].3), (OP_CONST, 4));
    let process = got[2];
    assert_eq!(process.0, OP_PROCESS);
    assert_eq!((process.2, process.4), (got[1].1, 4));
    let index = process.1;
    assert!((index as usize) < MAX_REGS);
    let end = process.3 as usize;
    // The send's value is the index register itself.
    assert_eq!(got[end - 1], (OP_SEND, 0, index, 0, 0));
    // At the top level: CONSUME with no body, its END, then CLOSE.
    assert_eq!(got[end + 1].0, OP_CONSUME);
    assert_eq!(got[end + 1].4 as usize, end + 2);
    assert_eq!(got[end + 2], (OP_END, 0, NO_REG, end as u32 + 1, 0));
    assert_eq!(got[end + 3], (OP_CLOSE, 0, NO_REG, 0, 0));
    assert_eq!(w.csp_names().process(2), "compute");
}

#[test]
fn a_process_over_a_symbol_reads_its_count_at_launch() {
    let mut w = Workload::new();
    let x = w.tensor("x", &[64, 64]).unwrap();
    w.tensor("y", &[64, 64]).unwrap();
    let ch = w.channel("c", 1).unwrap();
    w.process_over("p", Axis::DenseDyn { symbol: 0, max: 3 }, |w, i| {
        let c = touch(w, x, i * 8);
        w.send(ch, 0, c);
    });
    let got = ops(&w.finish().unwrap());
    assert_eq!((got[1].0, got[1].3), (OP_SYMBOL, 0));
    assert_eq!((got[2].0, got[2].2, got[2].4), (OP_PROCESS, got[1].1, 3));
    // Value 0 needs no register.
    let end = got[2].3 as usize;
    assert_eq!(got[end - 1], (OP_SEND, 0, NO_REG, 0, 0));
}

fn channel_error(e: LowerError) -> (String, String) {
    match e {
        LowerError::Channel { channel, why } => (channel, why),
        e => panic!("not a channel error: {e}"),
    }
}

#[test]
fn bad_channels_are_lower_errors_naming_the_channel() {
    let mut w = Workload::new();
    let (name, why) = channel_error(w.channel("deep", 17).unwrap_err());
    assert_eq!(name, "deep");
    assert!(
        why.contains("depth 17; a channel holds 0 to 16 tokens"),
        "{why}"
    );
    let e = w.channel("late", 0).map(|_| ());
    assert!(e.is_ok());
    let (name, why) = channel_error(w.channel("late", 1).unwrap_err());
    assert_eq!((name.as_str(), why.as_str()), ("late", "declared twice"));
    let (_, why) = channel_error(
        w.channel_with_latency("slow", 1, MAX_CHANNEL_LATENCY + 1)
            .unwrap_err(),
    );
    assert!(why.contains("latency 16777216"), "{why}");
    // Up to MAX_CHANNELS, then one too many.
    for c in 1..MAX_CHANNELS {
        w.channel(&format!("c{c}"), 1).unwrap();
    }
    let (name, why) = channel_error(w.channel("extra", 1).unwrap_err());
    assert_eq!(name, "extra");
    assert!(why.contains("at most 16"), "{why}");
    // Inside a loop or a process.
    let mut w = Workload::new();
    let mut inner = Vec::new();
    w.parallel(Axis::Dense(2), |w, _| inner.push(w.channel("in_loop", 1)));
    w.process("p", |w| inner.push(w.channel("in_process", 1)));
    for e in inner {
        let (_, why) = channel_error(e.unwrap_err());
        assert!(
            why.contains("channels are declared at the top level"),
            "{why}"
        );
    }
}

#[test]
fn nested_or_oversized_processes_are_lower_errors() {
    let mut w = Workload::new();
    w.process("outer", |w| w.process("inner", |_| {}));
    let e = w.finish().unwrap_err();
    assert!(
        matches!(&e, LowerError::Process { process, why } if process == "inner" && why.contains("processes start at the top level")),
        "{e}"
    );
    let mut w = Workload::new();
    w.parallel(Axis::Dense(2), |w, _| w.process("in_loop", |_| {}));
    let e = w.finish().unwrap_err();
    assert!(
        matches!(&e, LowerError::Process { process, .. } if process == "in_loop"),
        "{e}"
    );
    let mut w = Workload::new();
    w.process_over("wide", Axis::Dense(17), |_, _| {});
    let e = w.finish().unwrap_err();
    assert_eq!(
        e.to_string(),
        "process wide: 17 replicas at most; a process has 1 to 16"
    );
    let mut w = Workload::new();
    w.process_over("none", Axis::Dense(0), |_, _| {});
    assert!(matches!(w.finish(), Err(LowerError::Process { .. })));
}

#[test]
fn a_send_must_name_the_last_call_of_its_process() {
    let mut w = Workload::new();
    let x = w.tensor("x", &[64, 64]).unwrap();
    w.tensor("y", &[64, 64]).unwrap();
    let ch = w.channel("tiles", 1).unwrap();
    w.process("p", |w| {
        let first = touch(w, x, Expr::Const(0));
        touch(w, x, Expr::Const(8));
        w.send(ch, 0, first);
    });
    let e = w.finish().unwrap_err();
    assert!(
        matches!(&e, LowerError::Send { channel, why } if channel == "tiles" && why.contains("not the last call this process made")),
        "{e}"
    );
    // A call of another process does not count.
    let mut w = Workload::new();
    let x = w.tensor("x", &[64, 64]).unwrap();
    w.tensor("y", &[64, 64]).unwrap();
    let ch = w.channel("tiles", 1).unwrap();
    let outside = touch(w_ref(&mut w), x, Expr::Const(0));
    w.process("p", |w| w.send(ch, 0, outside));
    let e = w.finish().unwrap_err();
    assert!(
        e.to_string()
            .contains("this process made no call before the send"),
        "{e}"
    );
    // The last call, inside the same consume body, is accepted.
    let (mut w, _) = pipeline(1).unwrap();
    w.finish().unwrap();
    // A `let_` between the call and its send would keep the device from
    // reserving the token's room before the call: refused.
    let mut w = Workload::new();
    let x = w.tensor("x", &[64, 64]).unwrap();
    w.tensor("y", &[64, 64]).unwrap();
    let ch = w.channel("tiles", 1).unwrap();
    w.process("p", |w| {
        let call = touch(w, x, Expr::Const(0));
        let v = w.let_(Expr::Const(3));
        w.send(ch, v, call);
    });
    let e = w.finish().unwrap_err();
    assert!(
        e.to_string()
            .contains("a send must come right after the call it names"),
        "{e}"
    );
}

fn w_ref(w: &mut Workload) -> &mut Workload {
    w
}

fn instr(op: u8, r: u8, x0: u8, imm: u32, imm2: u32) -> Instr {
    Instr {
        op,
        r,
        x: [x0, NO_REG, NO_REG, NO_REG, NO_REG, NO_REG],
        imm: U32::new(imm),
        imm2: U32::new(imm2),
    }
}

/// The validation error of a table with `program` and no tensors.
fn refused(program: Vec<Instr>) -> device_runtime::abi::TableError {
    let mut b = TableBuilder::new();
    b.set_program(program);
    let bytes = b.finish().unwrap();
    Table::parse(&bytes).unwrap_err()
}

#[test]
fn the_device_refuses_bad_csp_programs_naming_the_instruction() {
    let n = NO_REG;
    // A consume on an undeclared channel (channel 3; only 0 exists).
    let e = refused(vec![
        instr(OP_CHANNEL, 0, n, 0, 1),
        instr(OP_SEND, 0, n, 0, 0),
        instr(OP_CONSUME, 0, n, 3, 3),
        instr(OP_END, 0, n, 2, 0),
    ]);
    assert_eq!(
        (e.section, e.index, e.field, e.problem),
        (
            Section::Program,
            2,
            "imm",
            Problem::UndeclaredChannel { channel: 3 }
        ),
        "{e}"
    );
    // A channel nobody sends on: named at its CHANNEL.
    let e = refused(vec![
        instr(OP_CHANNEL, 0, n, 0, 1),
        instr(OP_CHANNEL, 0, n, 1, 1),
        instr(OP_SEND, 0, n, 0, 0),
        instr(OP_CONSUME, 0, n, 1, 4),
        instr(OP_END, 0, n, 3, 0),
    ]);
    assert_eq!(
        (e.index, e.field, e.problem),
        (1, "imm", Problem::NoSender { channel: 1 }),
        "{e}"
    );
    assert!(e.to_string().contains("nothing sends on channel 1"), "{e}");
    // A capacity above the maximum (bits 0..8 of imm2).
    let e = refused(vec![
        instr(OP_CHANNEL, 0, n, 0, 17 | 5 << 8),
        instr(OP_SEND, 0, n, 0, 0),
    ]);
    assert_eq!(
        (e.index, e.field, e.problem),
        (
            0,
            "imm2",
            Problem::OutOfRange {
                value: 17,
                min: 0,
                max: MAX_CHANNEL_CAPACITY as u64
            }
        ),
        "{e}"
    );
}

#[test]
fn the_builder_never_lowers_what_the_device_would_refuse() {
    // A channel nobody sends on passes the builder's checks and is refused
    // by the same validation the device runs, the channel named.
    let mut w = Workload::new();
    let ch = w.channel("orphan", 1).unwrap();
    w.consume(ch, |_, _| {});
    let e = w.finish().unwrap_err();
    assert!(
        matches!(&e, LowerError::Invalid(why) if why.contains("nothing sends on channel 0")),
        "{e}"
    );
}

/// Three stages over `tiles` tokens: load, compute (consume, call, send)
/// and store, the storer replicated `storers` times (1: a plain process).
fn three_stages(tiles: u32, storers: u32) -> Workload {
    let mut w = Workload::new();
    let x = w.tensor("x", &[64, 64]).unwrap();
    w.tensor("y", &[64, 64]).unwrap();
    let a = w.channel("a", 2).unwrap();
    let b = w.channel("b", 0).unwrap();
    w.process("loader", |w| {
        w.sequential(Axis::Dense(tiles), |w, i| {
            let c = touch(w, x, i.clone() * 8);
            w.send(a, i, c);
        });
    });
    w.process("compute", |w| {
        w.consume(a, |w, t| {
            let c = touch(w, x, t.clone() * 8);
            w.send(b, t, c);
        });
    });
    let store = |w: &mut Workload| {
        w.consume(b, |w, t| {
            touch(w, x, t * 8);
        })
    };
    if storers == 1 {
        w.process("storer", store);
    } else {
        w.process_over("storer", Axis::Dense(storers), |w, _| store(w));
    }
    w
}

fn count(w: &mut Workload) -> TaskCount {
    let table = w.finish().unwrap();
    count_tasks(&Table::parse(&table).unwrap(), None, &[]).unwrap()
}

#[test]
fn a_chain_of_consume_loops_counts_exactly() {
    // 8 loads, 8 computes (one per token of a), 8 stores (one per token of b).
    assert_eq!(count(&mut three_stages(8, 1)), TaskCount::Exact(24));
    assert_eq!(count(&mut three_stages(3, 1)), TaskCount::Exact(9));
}

#[test]
fn replicated_consumers_give_a_range_that_says_why() {
    // Two storers share b's 8 tokens: each runs 0 to 8 bodies.
    let n = count(&mut three_stages(8, 2));
    assert_eq!(
        n,
        TaskCount::Between {
            lo: 16,
            hi: 32,
            symbols: false,
            data: false,
            tokens: true
        }
    );
    assert_eq!(
        n.to_string(),
        "between 16 and 32 tasks (depending on which consume loop takes which token)"
    );
}

#[test]
fn inspect_renders_channels_processes_and_tokens() {
    let mut w = three_stages(8, 2);
    let table = w.finish().unwrap();
    let text = inspect_named(&table, false, &[], &w.csp_names());
    for want in [
        "declare channel 0 (a): capacity 2, latency 0 ticks",
        "declare channel 1 (b): capacity 0 (a rendezvous), latency 0 ticks",
        "process loader {",
        "process compute {",
        "process storer x r0 replicas as r1 (at most 2) {",
        "consume channel 0 (a) as r",
        "until closed and drained {",
        "}  (next token of channel 1 (b))",
        "on channel 1 (b): the process's last task completed",
        "}  (end of process storer: closes the channels it sends on)",
        "valid: 0 tasks, then a program of",
        "between 16 and 32 tasks (depending on which consume loop takes which token)",
    ] {
        assert!(text.contains(want), "no `{want}` in\n{text}");
    }
    // Without the names, channels go by number and processes by pc.
    let plain = inspect_with(&table, false, &[]);
    assert!(plain.contains("declare channel 0: capacity 2"), "{plain}");
    assert!(plain.contains("consume channel 0 as r"), "{plain}");
    assert!(plain.contains("process {"), "{plain}");
}

#[test]
fn a_deadlock_report_is_named_by_the_workload() {
    use device_runtime::abi::launch::Symbols;
    use device_runtime::sched::{RunError, RunOptions};
    use host_tools::semantic::run_semantic;
    use host_tools::shim::ShimError;
    // The producer is replicated over a symbol bound to 0: no live sender.
    let mut w = Workload::new();
    let x = w.tensor("x", &[64, 64]).unwrap();
    w.tensor("y", &[64, 64]).unwrap();
    let ch = w.channel("tiles", 1).unwrap();
    w.process_over("producer", Axis::DenseDyn { symbol: 0, max: 2 }, |w, i| {
        let c = touch(w, x, i * 8);
        w.send(ch, 0, c);
    });
    w.process("consumer", |w| {
        w.consume(ch, |w, t| {
            touch(w, x, t * 8);
        })
    });
    let table = w.finish().unwrap();
    let names = w.csp_names();
    let mut arena = vec![0u8; w.arena_size() as usize];
    let options = RunOptions {
        symbols: Symbols::new(&[0]).unwrap(),
        ..RunOptions::default()
    };
    let kinds = [wsp_ffi::CoreKind::Vector; 2];
    let e = run_semantic(&table, &mut arena, &kinds, &options).unwrap_err();
    let ShimError::Run(run) = e else {
        panic!("not a run error: {e}")
    };
    let RunError::ChannelDeadlock(report) = *run else {
        panic!("not a channel deadlock: {run}")
    };
    let consumer = names
        .processes
        .iter()
        .find(|p| p.1 == "consumer")
        .unwrap()
        .0;
    let legend = names.legend(&report).unwrap();
    assert_eq!(
        legend,
        format!("where process of pc {consumer} is `consumer`, channel 0 is `tiles`")
    );
    // The report itself numbers what the legend names.
    let text = report.to_string();
    assert!(
        text.contains(&format!("process of pc {consumer}")),
        "{text}"
    );
    assert!(text.contains("channel 0"), "{text}");
}
