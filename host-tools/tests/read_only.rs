//! Read-only tensors: validation finds the tensors no task writes (task
//! arguments and program `ARG`s alike), and their accesses take no
//! TensorMap entries, while a tensor written anywhere in the table keeps
//! every access ordered (write-after-read included).

use device_runtime::abi::program::NO_REG;
use device_runtime::abi::{Table, WRITES_TRACKED};
use device_runtime::orch::StallReason;
use host_tools::asm::{Asm, READ, WRITE};
use host_tools::shim::Shim;
use host_tools::table::{Arena, Arg, TableBuilder};
use wsp_ffi::ArgAccess::{In, Out};
use wsp_ffi::WspKernelId_WSP_KERNEL_ADD as ADD;

#[test]
fn validation_finds_the_tensors_no_task_writes() {
    let mut b = TableBuilder::new();
    let w = b.tensor("w", &[1, 1]).unwrap();
    let out = b.tensor("out", &[1, 4]).unwrap();
    let by_program = b.tensor("p", &[1, 1]).unwrap();
    let unused = b.tensor("unused", &[1, 1]).unwrap();
    let one = |t, access, col| Arg::tile(t, access, 0, col, 1, 1);
    b.task(
        ADD,
        &[one(w, In, 0), one(by_program, In, 0), one(out, Out, 0)],
        &[],
    )
    .unwrap();
    // p is written only by the program's call.
    let mut asm = Asm::default();
    asm.call(ADD);
    for (t, access) in [(w, READ), (w, READ), (by_program, WRITE)] {
        asm.arg(t, access, NO_REG, NO_REG, NO_REG);
    }
    b.set_program(asm.code);
    let bytes = b.finish().unwrap();
    let table = Table::parse(&bytes).unwrap();
    assert!(table.is_read_only(w.0));
    assert!(table.is_read_only(unused.0));
    assert!(!table.is_read_only(out.0));
    assert!(!table.is_read_only(by_program.0));

    // A tensor at or past WRITES_TRACKED counts as written: its accesses
    // stay tracked, which is always correct.
    let mut b = TableBuilder::new();
    let tensors: Vec<_> = (0..=WRITES_TRACKED)
        .map(|i| b.tensor(&format!("t{i}"), &[1, 1]).unwrap())
        .collect();
    let (first, last) = (tensors[0], tensors[WRITES_TRACKED]);
    b.task(
        ADD,
        &[one(last, In, 0), one(last, In, 0), one(first, Out, 0)],
        &[],
    )
    .unwrap();
    let bytes = b.finish().unwrap();
    let table = Table::parse(&bytes).unwrap();
    assert!(!table.is_read_only(first.0));
    assert!(table.is_read_only(tensors[WRITES_TRACKED - 1].0));
    assert!(!table.is_read_only(last.0));
}

/// `n` tasks `out[i] = w + w`; with `overwrite`, a last task then writes
/// `w = out[0] + out[0]`, so that `w` is no longer read-only.
fn reads_of_w(n: u32, overwrite: bool) -> (Vec<u8>, Arena, TableBuilder) {
    let mut b = TableBuilder::new();
    let w = b.tensor("w", &[1, 1]).unwrap();
    let out = b.tensor("out", &[1, n]).unwrap();
    let one = |t, access, col| Arg::tile(t, access, 0, col, 1, 1);
    for i in 0..n {
        b.task(ADD, &[one(w, In, 0), one(w, In, 0), one(out, Out, i)], &[])
            .unwrap();
    }
    if overwrite {
        b.task(
            ADD,
            &[one(out, In, 0), one(out, In, 0), one(w, Out, 0)],
            &[],
        )
        .unwrap();
    }
    let mut arena = Arena::zeroed(b.arena_size());
    arena.write_f32(b.layout(w), &[1.5]);
    (b.finish().unwrap(), arena, b)
}

#[test]
fn reads_of_a_read_only_tensor_take_no_tensor_map_entries() {
    const N: u32 = 300;
    for overwrite in [false, true] {
        let (table, mut arena, b) = reads_of_w(N, overwrite);
        let stats = Shim::default().run(&table, &mut arena.bytes).unwrap();
        // Every out element is 1.5 + 1.5 (each read of w saw the value the
        // run started with, also when a later task overwrites w), and the
        // overwrite saw out[0]: 3 + 3.
        let out = arena.read_f32(&b.layouts()[1]);
        assert_eq!(out, vec![3.0; N as usize], "overwrite {overwrite}");
        let w = arena.read_f32(&b.layouts()[0]);
        assert_eq!(w, vec![if overwrite { 6.0 } else { 1.5 }]);
        let tasks = stats.stalls.of(StallReason::TaskRingFull).high_water;
        let entries = stats.stalls.of(StallReason::TensorMapPoolFull).high_water;
        assert!(tasks >= 1, "{stats:?}");
        if overwrite {
            // Three tracked arguments per task in flight.
            assert!(
                entries > tasks,
                "entries {entries}, tasks in flight {tasks}"
            );
        } else {
            // Only the write of out[i]: one entry per task in flight.
            assert!(
                entries <= tasks,
                "entries {entries}, tasks in flight {tasks}"
            );
        }
    }
}
