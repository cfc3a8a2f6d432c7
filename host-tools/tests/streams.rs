//! Streams and events through the whole runtime: table, dispatcher,
//! scheduler threads and cores, under every dispatch policy.
//!
//! In semantic time the launch log shows the order in which tasks were
//! issued and when each ran, so the tests check the rules themselves:
//! a stream's tasks are issued in table order across scheduler threads,
//! they do overlap, and a task after an event wait starts only when every
//! task the event stands for has ended. The threaded shim runs the same
//! tables and must compute the same results.

use device_runtime::abi::Table;
use device_runtime::sched::RunOptions;
use device_runtime::sched::{kernel_args, Arena, DispatchKey, PolicyKind, SchedConfig};
use host_tools::semantic::{run_semantic_with, SemanticRun};
use host_tools::shim::Shim;
use host_tools::table::{Arena as Data, Arg, TableBuilder};
use wsp_ffi::ArgAccess::{In, Out};
use wsp_ffi::{CoreKind, WspKernelId_WSP_KERNEL_ADD as ADD};

/// Rows of the tensors: one task per row.
const ROWS: u32 = 36;
/// The row before which stream 3 waits for event 0, recorded on stream 1
/// before row `RECORD_AT`.
const RECORD_AT: u32 = 12;
const WAIT_AT: u32 = 14;

/// Y[r] = X[r] + X[r] for every row r, as independent tasks on streams
/// 1, 2, 3 in turn (row r on stream 1 + r % 3), with widths that vary so
/// that tasks take different times. Event 0 is recorded on stream 1 before
/// row `RECORD_AT` and waited for by stream 3 before row `WAIT_AT`.
fn table(events: bool) -> (Vec<u8>, Data, Vec<f32>) {
    let mut b = TableBuilder::new();
    let x = b.tensor("X", &[ROWS, 64]).unwrap();
    let y = b.tensor("Y", &[ROWS, 64]).unwrap();
    for r in 0..ROWS {
        if events && r == RECORD_AT {
            b.record_event(1, 0).unwrap();
        }
        if events && r == WAIT_AT {
            b.wait_event(3, 0).unwrap();
        }
        let cols = [64, 8, 32, 16][(r % 4) as usize];
        let args = [
            Arg::tile(x, In, r, 0, 1, cols),
            Arg::tile(x, In, r, 0, 1, cols),
            Arg::tile(y, Out, r, 0, 1, cols),
        ];
        b.task_on(1 + r % 3, ADD, &args, &[]).unwrap();
    }
    let bytes = b.finish().unwrap();
    let mut data = Data::zeroed(b.arena_size());
    let xs: Vec<f32> = (0..ROWS * 64).map(|i| (i % 97) as f32 * 0.25).collect();
    data.write_f32(b.layout(x), &xs);
    let mut want = vec![0.0; (ROWS * 64) as usize];
    for r in 0..ROWS as usize {
        let cols = [64, 8, 32, 16][r % 4];
        for c in 0..cols {
            want[r * 64 + c] = 2.0 * xs[r * 64 + c];
        }
    }
    (bytes, data, want)
}

fn stream_of(row: usize) -> usize {
    1 + row % 3
}

fn output(table: &[u8], data: &Data) -> Vec<f32> {
    let t = Table::parse(table).unwrap();
    let y = &t.tensors()[1];
    let start = y.arena_offset.get() as usize;
    data.bytes[start..start + (ROWS * 64 * 4) as usize]
        .chunks(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// For each launch of `run` over `data`, the table task (row) it ran: by
/// the address of its output view relative to the arena's start.
fn launch_rows(table: &[u8], data: &Data, run: &SemanticRun) -> Vec<usize> {
    let t = Table::parse(table).unwrap();
    let mut probe = vec![0u8; data.bytes.len()];
    let probe_base = probe.as_ptr() as u64;
    let probe = Arena::new(&mut probe);
    let outputs: Vec<u64> = (0..ROWS)
        .map(|i| kernel_args(&t, &probe, i).unwrap().tensors[2].addr - probe_base)
        .collect();
    let base = data.bytes.as_ptr() as u64;
    run.launches
        .iter()
        .map(|l| {
            let out = l.args.tensors[2].addr - base;
            outputs
                .iter()
                .position(|&o| o == out)
                .expect("a task's output")
        })
        .collect()
}

/// The run in semantic time, and for each table task its launch.
fn semantic(table: &[u8], sched: &SchedConfig) -> (SemanticRun, Vec<usize>) {
    let (_, mut data, want) = self::table(true);
    let kinds = vec![CoreKind::Vector; 4];
    let run = run_semantic_with(
        table,
        &mut data.bytes,
        &kinds,
        sched,
        &RunOptions::default(),
    )
    .unwrap();
    assert_eq!(output(table, &data), want, "{sched:?}");
    let rows = launch_rows(table, &data, &run);
    let launch_of = (0..ROWS as usize)
        .map(|r| {
            rows.iter()
                .position(|&row| row == r)
                .expect("every task was launched")
        })
        .collect();
    (run, launch_of)
}

fn configs() -> Vec<SchedConfig> {
    let mut all = Vec::new();
    for policy in PolicyKind::ALL {
        for threads in [1, 2, 4] {
            all.push(SchedConfig {
                threads,
                policy,
                key: DispatchKey::TaskIndex,
                ..SchedConfig::default()
            });
        }
    }
    all
}

#[test]
fn streams_issue_in_order_and_overlap_under_every_policy() {
    let (bytes, _, _) = table(true);
    for sched in configs() {
        let (run, launch) = semantic(&bytes, &sched);
        assert_eq!(run.launches.len(), ROWS as usize);
        let mut overlapped = 0;
        for row in 3..ROWS as usize {
            // The task before it on its stream is row - 3.
            let (before, this) = (launch[row - 3], launch[row]);
            assert!(
                before < this,
                "{sched:?}: row {row} issued before row {} on stream {}",
                row - 3,
                stream_of(row)
            );
            let (a, b) = (&run.launches[before], &run.launches[this]);
            if b.start < a.end {
                overlapped += 1;
            }
        }
        assert!(
            overlapped > 0,
            "{sched:?}: a stream's tasks may run at the same time, and here some do"
        );
    }
}

#[test]
fn an_event_wait_holds_the_stream_until_the_recorded_tasks_end() {
    let (with, _, _) = table(true);
    let (without, _, _) = table(false);
    for sched in configs() {
        let (run, launch) = semantic(&with, &sched);
        // Event 0 stands for the rows on stream 1 before RECORD_AT.
        let recorded_end = (0..RECORD_AT as usize)
            .filter(|&r| stream_of(r) == 1)
            .map(|r| run.launches[launch[r]].end)
            .max()
            .unwrap();
        // Stream 3's first row from WAIT_AT on, and every later one.
        for row in (WAIT_AT as usize..ROWS as usize).filter(|&r| stream_of(r) == 3) {
            let l = &run.launches[launch[row]];
            assert!(
                l.start >= recorded_end,
                "{sched:?}: row {row} started at {} before the event's tasks ended at {recorded_end}",
                l.start
            );
        }
        // Without the event the same row may start earlier: the wait is what
        // held it (checked on one thread, where the order is simplest).
        if sched.threads == 1 && sched.policy == PolicyKind::RoundRobin {
            let (free, launch_free) = semantic(&without, &sched);
            let first = (WAIT_AT as usize..ROWS as usize)
                .find(|&r| stream_of(r) == 3)
                .unwrap();
            assert!(
                free.launches[launch_free[first]].start < recorded_end,
                "the test must be able to fail: without the wait row {first} starts earlier"
            );
        }
    }
}

#[test]
fn streams_run_correctly_on_threads_in_the_shim() {
    let (bytes, _, want) = table(true);
    for sched in configs() {
        let (_, mut data, _) = table(true);
        let shim = Shim {
            cube_cores: 0,
            vector_cores: 4,
            sched,
            ..Shim::default()
        };
        let stats = shim.run(&bytes, &mut data.bytes).unwrap();
        assert_eq!(stats.tasks, u64::from(ROWS));
        assert_eq!(output(&bytes, &data), want, "{sched:?}");
    }
}

#[test]
fn the_stream_key_keeps_each_stream_on_one_thread() {
    let (bytes, _, _) = table(true);
    let sched = SchedConfig {
        threads: 3,
        policy: PolicyKind::Affinity,
        key: DispatchKey::Stream,
        ..SchedConfig::default()
    };
    let kinds = vec![CoreKind::Vector; 6];
    let (_, mut data, want) = table(true);
    let run = run_semantic_with(
        &bytes,
        &mut data.bytes,
        &kinds,
        &sched,
        &RunOptions::default(),
    )
    .unwrap();
    assert_eq!(output(&bytes, &data), want);
    // Streams 1, 2, 3 have keys 1, 2, 3: threads 1, 2, 0 (key modulo 3);
    // each thread owns cores t and t + 3.
    let rows = launch_rows(&bytes, &data, &run);
    for (l, &row) in run.launches.iter().zip(&rows) {
        assert_eq!(
            l.core % 3,
            stream_of(row) % 3,
            "row {row} on core {}",
            l.core
        );
    }
    let per_thread: Vec<u64> = run.stats.threads().iter().map(|t| t.issued).collect();
    assert_eq!(per_thread, [12, 12, 12]);
}
