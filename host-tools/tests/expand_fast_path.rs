//! The expander's fast path for calls (decoded call sites, the contract
//! checked once per distinct shapes) against what each task must be: a
//! contract that breaks on a later iteration of the same call is still
//! refused, and a loop body with more calls than the expander keeps decoded
//! gives every task its own regions.

use device_runtime::abi::Table;
use device_runtime::expand::{ExpandError, Expander, Next, TaskSpec, CALL_SITES};
use host_tools::inspect::HostExpansion;
use host_tools::program::{Axis, Expr, Region, Workload};
use host_tools::program_examples::T;
use wsp_ffi::WspKernelId_WSP_KERNEL_ADD as ADD;

/// Expands `table` to its end or first error: the tasks, and the error.
/// Panics past 10 000 tasks (more than these tables have).
fn expand(table: &Table<'_>) -> (Vec<TaskSpec>, Option<ExpandError>) {
    let mut expander = Expander::new(table);
    let mut cx = HostExpansion {
        arena: None,
        run_writes: &[],
        symbols: &[],
        next: 0,
        needs_data: false,
    };
    let mut spec = TaskSpec::empty();
    let mut tasks = Vec::new();
    loop {
        match expander.step_into(table, &mut cx, &mut spec) {
            Ok(Next::Task) => {
                assert!(tasks.len() < 10_000, "expansion does not end");
                tasks.push(spec.clone());
                cx.next += 1;
            }
            Ok(Next::Done) => return (tasks, None),
            Ok(_) => {}
            Err(e) => return (tasks, Some(e)),
        }
    }
}

#[test]
fn a_contract_that_breaks_on_a_later_iteration_is_refused() {
    let mut w = Workload::new();
    let x = w.tensor("x", &[T, T]).unwrap();
    let y = w.tensor("y", &[T, T]).unwrap();
    // Iteration 0: three T x T tiles; iteration 1: the output is one
    // column narrower than the inputs, which `add` refuses.
    w.parallel(Axis::Dense(2), |w, i| {
        let cols = Expr::Const(T as i64) - i;
        w.call(
            ADD,
            &[
                x.tile(0, 0, T, T),
                x.tile(0, 0, T, T),
                y.tile(0, 0, T, cols),
            ],
            &[],
        );
    });
    let bytes = w.finish().unwrap();
    let table = Table::parse(&bytes).unwrap();
    let (tasks, e) = expand(&table);
    assert_eq!(tasks.len(), 1, "the first iteration's task");
    assert!(matches!(e, Some(ExpandError::Contract(_))), "{e:?}");
}

#[test]
fn more_calls_than_decoded_sites_each_give_their_own_tasks() {
    const CALLS: u32 = CALL_SITES as u32 + 3;
    const ROWS: u32 = 4;
    let mut w = Workload::new();
    let x = w.tensor("x", &[ROWS * T, CALLS * T]).unwrap();
    let y = w.tensor("y", &[ROWS * T, CALLS * T]).unwrap();
    w.parallel(Axis::Dense(ROWS), |w, i| {
        for k in 0..CALLS {
            let (row, col) = (i.clone() * T, Expr::Const((k * T) as i64));
            w.call(
                ADD,
                &[
                    x.tile(row.clone(), col.clone(), T, T),
                    x.tile(row.clone(), col.clone(), T, T),
                    y.tile(row, col, T, T),
                ],
                &[],
            );
        }
    });
    let bytes = w.finish().unwrap();
    let table = Table::parse(&bytes).unwrap();
    let (tasks, e) = expand(&table);
    assert_eq!(e, None);
    assert_eq!(tasks.len() as u32, ROWS * CALLS);
    for (n, task) in tasks.iter().enumerate() {
        let (i, k) = (n as u32 / CALLS, n as u32 % CALLS);
        assert_eq!(task.kernel.id, ADD);
        assert_eq!(task.loops.as_slice(), &[i], "task {n}");
        assert_eq!(task.args().len(), 3);
        for (a, arg) in task.args().iter().enumerate() {
            let want = if a == 2 { y } else { x };
            assert_eq!(arg.tensor, want.0, "task {n} arg {a}");
            assert_eq!(arg.region.offset, [i * T, k * T, 0, 0], "task {n} arg {a}");
            assert_eq!(arg.region.extent, [T, T, 1, 1], "task {n} arg {a}");
        }
    }
}

#[test]
fn a_call_on_tensors_of_different_ranks_gives_each_its_region() {
    const N: u32 = 3;
    let mut w = Workload::new();
    let x = w.tensor("x", &[N, T, T]).unwrap();
    let y = w.tensor("y", &[T, N * T]).unwrap();
    // out[:, i*T ..] = x[i] + x[i], with x of rank 3 and y of rank 2.
    w.parallel(Axis::Dense(N), |w, i| {
        let tile = Region {
            tensor: x,
            offset: vec![i.clone(), Expr::Const(0), Expr::Const(0)],
            rows: T.into(),
            cols: T.into(),
        };
        w.call(ADD, &[tile.clone(), tile, y.tile(0, i * T, T, T)], &[]);
    });
    let bytes = w.finish().unwrap();
    let table = Table::parse(&bytes).unwrap();
    let (tasks, e) = expand(&table);
    assert_eq!(e, None);
    assert_eq!(tasks.len() as u32, N);
    for (i, task) in (0u32..).zip(&tasks) {
        let args = task.args();
        for a in &args[..2] {
            assert_eq!(a.tensor, x.0);
            assert_eq!(a.region.offset, [i, 0, 0, 0], "task {i}");
            assert_eq!(a.region.extent, [1, T, T, 1], "task {i}");
        }
        assert_eq!(args[2].tensor, y.0);
        assert_eq!(args[2].region.offset, [0, i * T, 0, 0], "task {i}");
        assert_eq!(args[2].region.extent, [T, T, 1, 1], "task {i}");
    }
}
