//! Read-only tensors: validation finds the tensors no task writes (task
//! arguments and program `ARG`s alike), and their accesses take no
//! TensorMap entries, while a tensor written anywhere in the table keeps
//! every access ordered (write-after-read included).

use device_runtime::abi::program::NO_REG;
use device_runtime::abi::{Table, TableHeader, TaskDesc, WRITES_TRACKED};
use device_runtime::orch::StallReason;
use host_tools::asm::{Asm, READ, WRITE};
use host_tools::shim::Shim;
use host_tools::table::{seal, Arena, Arg, TableBuilder};
use wsp_ffi::ArgAccess::{In, Out};
use wsp_ffi::WspKernelId_WSP_KERNEL_ADD as ADD;
use zerocopy::FromBytes;

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

/// Task `i`'s descriptor in `bytes`.
fn task_desc(bytes: &mut [u8], i: usize) -> &mut TaskDesc {
    let at = TableHeader::ref_from_prefix(bytes)
        .unwrap()
        .0
        .tasks
        .offset
        .get() as usize;
    TaskDesc::mut_from_prefix(&mut bytes[at + i * size_of::<TaskDesc>()..])
        .unwrap()
        .0
}

/// What the arguments section writes counts whether validation finds it
/// on its pass over the tasks (their arguments are the whole section, in
/// order) or on a pass of its own (they are not): a task using another's
/// argument block leaves its own block unused, and the tensor that block
/// writes is written all the same.
#[test]
fn an_argument_block_no_task_uses_still_writes() {
    let mut b = TableBuilder::new();
    let x = b.tensor("x", &[1, 1]).unwrap();
    let y: Vec<_> = (0..3)
        .map(|i| b.tensor(&format!("y{i}"), &[1, 1]).unwrap())
        .collect();
    let one = |t, access| Arg::tile(t, access, 0, 0, 1, 1);
    for &y in &y {
        b.task(ADD, &[one(x, In), one(x, In), one(y, Out)], &[])
            .unwrap();
    }
    let bytes = b.finish().unwrap();
    let written = |bytes: &[u8]| {
        let table = Table::parse(bytes).unwrap();
        let read_only = |t: host_tools::table::TensorId| table.is_read_only(t.0);
        (
            read_only(x),
            y.iter().map(|&t| read_only(t)).collect::<Vec<_>>(),
        )
    };
    assert_eq!(written(&bytes), (true, vec![false; 3]));
    // Tasks 0 and 1 swap argument blocks: the section out of task order.
    let mut swapped = bytes.clone();
    let (a, b) = (
        task_desc(&mut swapped, 0).first_arg,
        task_desc(&mut swapped, 1).first_arg,
    );
    task_desc(&mut swapped, 0).first_arg = b;
    task_desc(&mut swapped, 1).first_arg = a;
    seal(&mut swapped);
    assert_eq!(written(&swapped), (true, vec![false; 3]));
    // Task 2 uses task 1's block: the block writing y2 is used by none.
    let mut shared = bytes;
    let first = task_desc(&mut shared, 1).first_arg;
    task_desc(&mut shared, 2).first_arg = first;
    seal(&mut shared);
    assert_eq!(written(&shared), (true, vec![false; 3]));
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
